"""`--linear fp8` on run / compare (a real tiny run on the CPU records it in the manifest) and its usage errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)


def test_linear_fp8_with_stock_attention_is_a_usage_error():
    r = runner.invoke(app, ["run", "tiny-sd3", "--prompt", "a", "--device", "cpu", "--attention", "sdpa",
                            "--linear", "fp8"])
    assert r.exit_code == 2 and "--linear" in r.output
    r = runner.invoke(app, ["run", "tiny-sd3", "--prompt", "a", "--device", "cpu", "--linear", "int4"])
    assert r.exit_code == 2


def test_run_with_fp8_linears_records_them(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "tiny-sd3", "--prompt", "a", "--seed", "0", "--steps", "2", "--device", "cpu",
                            "--linear", "fp8", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["attention"]["linear"] == "fp8"
    setup = manifest["setup"]["sage"]["rank0"]
    assert "linear" in setup and setup["linear"]["emulated"] is True, setup
