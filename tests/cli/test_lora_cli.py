"""`--lora PATH[:SCALE]` on the CLI: usage errors (exit 2, before any model loads, naming the option), and
`compare --lora` on the tiny Wan pipeline with two random LoRAs built offline: both variants run with them, the
manifest records each file's path, SHA-256 and scale, and the sage variant's FP8 bases run beside them."""

import hashlib

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.runs.directory import RunDir

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture
def lora_file(tmp_path):
    path = tmp_path / "style.safetensors"
    path.write_bytes(b"not read before the model loads")
    return path


@pytest.mark.parametrize("suffix,match", [
    ("", None),  # a good value, with a bad one after it
    (":abc", "the scale 'abc' is not a number"),
    (":nan", "must be a finite number"),
    (":inf", "must be a finite number"),
])
def test_lora_usage_errors_exit_2_before_loading(suffix, match, lora_file, tmp_path, fake_model):
    values = [f"{lora_file}{suffix}"] + ([str(tmp_path / "missing.safetensors")] if match is None else [])
    args = ["run", "tiny-wan2.1", "-p", "x"] + [a for v in values for a in ("--lora", v)]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "--lora" in r.output and (match or "no such file") in r.output, r.output
    assert fake_model.loads == []


def test_lora_directory_is_a_usage_error(tmp_path, fake_model):
    r = runner.invoke(app, ["compare", "tiny-wan2.1", "-p", "x", "--lora", str(tmp_path)])
    assert r.exit_code == 2 and "--lora" in r.output and "is a directory" in r.output, r.output
    assert fake_model.loads == []


def test_lora_without_peft_is_a_usage_error(lora_file, fake_model, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    r = runner.invoke(app, ["run", "tiny-wan2.1", "-p", "x", "--lora", str(lora_file)])
    assert r.exit_code == 2 and "--lora" in r.output and "sagegen[lora]" in r.output, r.output
    assert fake_model.loads == []


def test_compare_with_two_loras_records_them(tmp_path):
    pytest.importorskip("peft", reason="peft (sagegen's `lora` extra) is not installed")
    import torch

    from sagegen.models.tiny_video import build_tiny_video_pipeline
    from tests.support.lora import write_lora

    pipe = build_tiny_video_pipeline("wan2.1", dtype=torch.float32)  # the architecture tiny-wan2.1 loads
    a = write_lora(pipe, "wan", tmp_path / "a", seed=1)
    b = write_lora(pipe, "wan", tmp_path / "b", seed=2)
    out = tmp_path / "run"
    r = runner.invoke(app, ["compare", "tiny-wan2.1", "-p", "a red fox", "--steps", "2", "--warmup", "0",
                            "--backend", "reference", "--linear", "fp8", "--lora", f"{a}:0.5", "--lora", str(b),
                            "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    manifest = RunDir(out).manifest
    assert manifest["settings"]["lora"] == [
        {"path": str(a.resolve()), "sha256": hashlib.sha256(a.read_bytes()).hexdigest(), "scale": 0.5},
        {"path": str(b.resolve()), "sha256": hashlib.sha256(b.read_bytes()).hexdigest(), "scale": 1.0}]
    for variant in ("sdpa", "sage"):
        setup = manifest["setup"][variant]["rank0"]
        assert setup["lora"] == {"adapters": ["lora0", "lora1"], "scales": [0.5, 1.0], "layers": 20}
    linear = manifest["setup"]["sage"]["rank0"]["linear"]
    assert linear["lora"]["layers"] == 20 and linear["lora"]["adapters"] == ["lora0", "lora1"]
    # every LoRA base is FP8 or listed bf16 with its reason (tiny Wan's two blocks are the first and the last,
    # which the default policy keeps in bf16)
    bf16_bases = linear["lora"]["bf16_base_layers"]
    assert linear["lora"]["fp8_base_layers"] + len(bf16_bases) == 20
    assert all(why.startswith("in kept block") for why in bf16_bases.values()), bf16_bases
