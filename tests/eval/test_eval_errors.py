"""`sagegen eval` when things go wrong: a set metric that cannot be computed, weights missing on a re-run,
per-metric settings in a merged metrics.json, null values in the table, frames too small for LPIPS, and one
mismatched sample."""

import json
import shutil

import numpy as np
import pytest
import torch
import typer
from rich.console import Console
from typer.testing import CliRunner

from sagegen.eval import fidelity
from sagegen.eval.fid import FeatureExtractor
from sagegen.eval.runner import EvalOptions, evaluate
from sagegen.testing.metric_standins import write_tiny_inception, write_tiny_lpips
from sagegen.testing.run_dirs import make_synthetic_run
from sagegen.eval.table import metrics_table

QUIET = {"log": lambda s: None}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    d = tmp_path_factory.mktemp("w")
    return {"inception": str(write_tiny_inception(d / "inc.pt")), "lpips": str(write_tiny_lpips(d / "lpips.pth"))}


def _app():
    from sagegen.cli import eval_cmd

    a = typer.Typer()
    eval_cmd.register(a)
    a.command("noop", hidden=True)(lambda: None)  # two commands: typer keeps `eval` as a subcommand
    return a


def test_fid_kid_errors_leave_the_other_metrics_written(tmp_path, weights, monkeypatch):
    run = make_synthetic_run(tmp_path / "one", kind="image", prompts=["a lone cat"], height=48, width=48)
    doc = evaluate(run, EvalOptions(metrics=["fid", "kid", "psnr"], inception_weights=weights["inception"]), **QUIET)
    m = json.loads((run / "metrics.json").read_text())["metrics"]
    assert m == json.loads(json.dumps(doc["metrics"]))
    assert m["fid"]["status"] == "error" and "at least 2 feature vectors" in m["fid"]["reason"]
    assert m["kid"]["status"] == "error" and "at least 2 images per set" in m["kid"]["reason"]
    assert m["psnr"]["status"] == "ok"
    # the CLI reports it like any other per-metric error: a line under the table, exit code 0
    monkeypatch.setenv("SAGEGEN_INCEPTION_WEIGHTS", weights["inception"])
    res = CliRunner().invoke(_app(), ["eval", str(run), "-m", "fid,psnr"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "fid error: ValueError: FID needs at least 2 feature vectors" in res.output.replace("\n", " ")


def test_cli_prints_reasons_verbatim(tmp_path, monkeypatch):
    """A reason with brackets (the install line ``sagegen[eval]``) reaches the terminal as written, not read as
    rich markup."""
    from sagegen.eval import runner

    def no_open_clip():
        raise ModuleNotFoundError("No module named 'open_clip'", name="open_clip")

    defaults = runner._default_loaders
    monkeypatch.setattr(runner, "_default_loaders", lambda opts: {**defaults(opts), "clip": no_open_clip})
    run = make_synthetic_run(tmp_path / "one", kind="image", prompts=["a lone cat"], height=48, width=48)
    res = CliRunner().invoke(_app(), ["eval", str(run), "-m", "clipscore,psnr"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "clipscore skipped: open_clip is not installed: pip install 'sagegen[eval]'" in res.output, res.output
    odd = tmp_path / "[odd] run"  # a path with brackets, in an error message
    res = CliRunner().invoke(_app(), ["eval", str(odd)], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "[odd] run" in res.output.replace("\n", ""), res.output


def test_nan_features_are_an_error_never_a_score(tmp_path):
    run = make_synthetic_run(tmp_path / "nan", prompts=["a", "b"], frames=3, height=32, width=32)
    nan_net = FeatureExtractor(fn=lambda x: torch.full((x.shape[0], 4), float("nan")), label="nan net",
                               comparable=False)
    doc = evaluate(run, EvalOptions(metrics=["fid", "kid", "ssim"], loaders={"inception": lambda: nan_net}), **QUIET)
    m = doc["metrics"]
    assert m["fid"]["status"] == "error" and "NaN" in m["fid"]["reason"]
    assert m["kid"]["status"] == "error" and "NaN" in m["kid"]["reason"]
    assert m["ssim"]["status"] == "ok"


def test_rerun_without_weights_keeps_the_earlier_ok_entry(tmp_path, weights, monkeypatch):
    monkeypatch.delenv("SAGEGEN_INCEPTION_WEIGHTS", raising=False)
    monkeypatch.delenv("SAGEGEN_LPIPS_WEIGHTS", raising=False)
    monkeypatch.setattr("sagegen.eval.weights._alexnet_from_torch_cache", lambda: None)
    run = make_synthetic_run(tmp_path / "keep", prompts=["a", "b"], frames=3, height=40, width=40)
    first = evaluate(run, EvalOptions(metrics=["fid", "lpips", "psnr"], inception_weights=weights["inception"],
                                      lpips_weights=weights["lpips"]), **QUIET)["metrics"]
    assert first["fid"]["status"] == first["lpips"]["status"] == "ok"
    lines = []
    second = evaluate(run, EvalOptions(metrics=["fid", "lpips", "psnr"]), log=lines.append)["metrics"]
    assert second["fid"] == first["fid"] and second["lpips"] == first["lpips"]
    assert any(s.startswith("fid: kept the earlier result") and "--inception-weights" in s for s in lines), lines
    assert any(s.startswith("lpips: kept the earlier result") for s in lines), lines
    # a metric that never succeeded is still recorded as skipped
    third = evaluate(run, EvalOptions(metrics=["kid"]), **QUIET)["metrics"]
    assert third["kid"]["status"] == "skipped"


def test_each_metric_records_the_settings_it_was_computed_with(tmp_path, weights):
    run = make_synthetic_run(tmp_path / "settings", prompts=["a", "b", "c"], frames=3, height=32, width=32)
    sample_json = run / "samples" / "sage" / "p002-s0" / "sample.json"
    hidden = tmp_path / "sample.json"
    shutil.move(sample_json, hidden)  # p002 unfinished for the first call
    evaluate(run, EvalOptions(metrics=["psnr", "fid"], inception_weights=weights["inception"],
                              fid_frames_per_sample=2), **QUIET)
    shutil.move(hidden, sample_json)
    doc = evaluate(run, EvalOptions(metrics=["ssim"]), **QUIET)
    m = doc["metrics"]
    assert "bootstrap" not in doc  # a top-level n_boot would describe only the latest call
    assert [s["id"] for s in doc["samples"]] == ["p000-s0", "p001-s0", "p002-s0"]
    assert m["psnr"]["interval"]["method"] == "student-t" and m["psnr"]["samples"] == ["p000-s0", "p001-s0"]
    assert m["psnr"]["n_samples"] == 2
    assert m["ssim"]["interval"]["over"] == "samples" and m["ssim"]["n_samples"] == 3
    assert m["fid"]["samples"] == ["p000-s0", "p001-s0"] and m["fid"]["frames_per_sample"] == 2
    assert "interval" not in m["fid"] and m["fid"]["n"] == {"sdpa": 4, "sage": 4}
    assert all(e["evaluated"] for e in m.values())


def test_table_shows_null_values_as_dashes():
    doc = {"baseline": "sdpa", "candidates": ["sage"], "metrics": {
        "fid": {"status": "ok", "kind": "set", "higher_is_better": False, "n": {"sdpa": 2, "sage": 2},
                "vs_baseline": {"sage": {"value": None}}, "vs_reference": {"sdpa": {"value": None},
                                                                          "sage": {"value": None}},
                "delta_vs_reference": {"sage": {"value": None}}},
        "kid": {"status": "ok", "kind": "set", "higher_is_better": False, "n": {"sdpa": 2, "sage": 2},
                "vs_baseline": {"sage": {"value": 0.25, "std": None}}},
        "psnr": {"status": "ok", "kind": "paired", "higher_is_better": True,
                 "aggregate": {"sage": {"mean": None, "ci": None, "n": 0}}}}}
    console = Console(width=200, record=True)
    console.print(metrics_table(doc))
    text = console.export_text()
    assert "— vs base" in text and "— vs ref" in text
    assert "0.25000 vs base" in text and "±" not in text  # no std: none shown
    assert "2 images each (sdpa, sage)" in text and "{'sdpa'" not in text


def test_lpips_on_tiny_frames_names_the_minimum_size(tmp_path, weights):
    model = fidelity.load_lpips(weights["lpips"])
    x = np.zeros((1, 24, 40, 3), np.uint8)
    with pytest.raises(ValueError, match=r"24x40 are too small for LPIPS.*at least 31px"):
        fidelity.lpips_frames(model, x, x)
    assert fidelity.lpips_frames(model, np.zeros((1, 31, 31, 3), np.uint8), np.zeros((1, 31, 31, 3), np.uint8))
    run = make_synthetic_run(tmp_path / "tiny", prompts=["a"], frames=2, height=24, width=24)
    m = evaluate(run, EvalOptions(metrics=["lpips", "psnr"], lpips_weights=weights["lpips"]), **QUIET)["metrics"]
    assert m["lpips"]["status"] == "error" and "at least 31px" in m["lpips"]["reason"]
    assert m["psnr"]["status"] == "ok"


def test_one_mismatched_sample_is_that_samples_error_only(tmp_path):
    run = make_synthetic_run(tmp_path / "mis", prompts=["a", "b", "c"], frames=4, height=32, width=32)
    (run / "samples" / "sage" / "p001-s0" / "frames" / "00003.png").unlink()
    m = evaluate(run, EvalOptions(metrics=["psnr", "ssim"]), **QUIET)["metrics"]
    for name in ("psnr", "ssim"):
        e = m[name]
        assert e["status"] == "ok" and e["samples"] == ["p000-s0", "p002-s0"] and e["aggregate"]["sage"]["n"] == 2
        # named for what it is (a missing frame), not as the shape mismatch it would cause
        assert "1 of its 4 frames are missing" in e["sample_errors"]["sage"]["p001-s0"]
        assert "1 sample(s) failed" in e["warning"] and "p001-s0" in e["warning"]


def test_a_metric_named_for_the_other_kind_of_run_is_a_usage_error(tmp_path):
    """`-m clipsim` on an image run (or clipscore on a video run) is refused (exit 2) before anything is
    evaluated; ``all`` and no --metric leave such metrics out and name them instead."""
    run = make_synthetic_run(tmp_path / "img", kind="image", prompts=["a lone cat"], height=48, width=48)
    res = CliRunner().invoke(_app(), ["eval", str(run), "-m", "psnr,clipsim"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "clipsim is for video models" in " ".join(res.output.split()), res.output
    assert "CLIP mode" not in res.output and not (run / "metrics.json").exists()
    res = CliRunner().invoke(_app(), ["eval", str(run), "-m", "psnr,foo"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "unknown metric 'foo'" in res.output and "psnr,foo" not in res.output
    res = CliRunner().invoke(_app(), ["eval", str(run), "-m", "psnr,all"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "clipsim not applicable" in " ".join(res.output.split()), res.output
