"""`--sparse` on the CLI: usage errors (exit 2, before loading), and `compare --sparse` on a tiny model writing
the realized density into the manifest and the HTML report."""

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.runs.directory import RunDir

runner = CliRunner()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SAGEGEN_DEBUG"):
        monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize("args,match", [
    (["run", "tiny-hunyuanvideo", "-p", "x", "--sparse", "topq=1"], "start with"),
    (["compare", "tiny-hunyuanvideo", "-p", "x", "--sparse", "cdf=1.5"], "value"),
    (["run", "tiny-hunyuanvideo", "-p", "x", "--attention", "sdpa", "--sparse", "topk=0.5"], "applies to sagegen"),
    (["run", "tiny-hunyuanvideo", "-p", "x", "--sparse", "calib=/nonexistent/c.json"], "no such file"),
    (["calibrate", "tiny-hunyuanvideo", "-p", "x", "--candidates", "0.5,2"], "in \\(0, 1\\]"),
])
def test_sparse_usage_errors_exit_2(args, match):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "--sparse" in r.output or "--candidates" in r.output
    import re
    assert re.search(match, r.output), r.output


def test_compare_sparse_records_density_in_manifest_and_report(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["compare", "tiny-hunyuanvideo", "-p", "a red fox", "--steps", "4", "--warmup", "0",
                            "--backend", "reference", "--sparse", "topk=0.5,min_tokens=0", "--quiet",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    setup = RunDir(out).manifest["setup"]["sage"]["rank0"]
    assert setup["attention_calls"]["sparse_calls"] == 3  # steps 1-3 (step 0 dense), one layer (block 0 dense)
    dens = setup["sparse"]["density"]
    assert setup["sparse"]["config"]["mode"] == "topk" and 0 < dens["overall"] <= 1
    assert set(dens["per_step"]) == {"1", "2", "3"}
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    html = (out / "report" / "report.html").read_text()
    assert "Block-sparse attention" in html and "single_transformer_blocks.0.attn" in html
