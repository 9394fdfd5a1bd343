"""End to end on a CPU: `sagegen compare` and `sagegen run` on the built-in tiny model of each family."""

import json
import shlex

import numpy as np
import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.runs.directory import RunDir, latest_run

runner = CliRunner()
FAMILIES = {"tiny-cogvideox": 9, "tiny-hunyuanvideo": 9, "tiny-mochi": 7, "tiny-flux": 1, "tiny-sd3": 1}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SAGEGEN_DEBUG"):
        monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize("model", list(FAMILIES))
def test_compare_tiny_family(model, tmp_path):
    out = tmp_path / "[fox] run"  # brackets and a space: printed verbatim, and quoted where a command is suggested
    args = ["compare", model, "--prompt", "a red fox in the snow", "--steps", "2", "--warmup", "0", "--quiet",
            "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    printed = r.output.replace("\n", "")
    assert "speedup" in r.output and f"Output: {out}" in printed
    assert f"Next: sagegen eval {shlex.quote(str(out))}" in printed and f"-> {out}" in printed
    rd = RunDir(out)
    m = rd.manifest
    assert m["variants"] == ["sdpa", "sage"] and m["model"]["name"] == model
    assert m["settings"]["steps"] == 2 and m["command"][1:3] == ["compare", model]
    for v in ("sdpa", "sage"):
        t = m["timings"][v]["p000-s0"]
        assert t["total_s"] > 0 and t["denoise_s"] > 0 and t["decode_s"] >= 0
        s = rd.sample(v, "p000-s0")
        assert s["n_frames"] == FAMILIES[model] and len(rd.frames(v, "p000-s0")) == FAMILIES[model]
        media = rd.video_path(v, "p000-s0") if FAMILIES[model] > 1 else rd.image_path(v, "p000-s0")
        assert media.stat().st_size > 0
    calls = m["setup"]["sage"]["rank0"]["attention_calls"]
    assert calls.get("routed", 0) > 0  # sagegen's attention really ran in the sage variant
    a, b = rd.frames_array("sdpa", "p000-s0"), rd.frames_array("sage", "p000-s0")
    assert a.shape == b.shape and a.dtype == np.uint8

    # the same command again resumes: nothing is regenerated
    before = json.loads(rd.manifest_path.read_text())["timings"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and "already finished" in r.output
    assert json.loads(rd.manifest_path.read_text())["timings"] == before


def test_run_default_out_resume_and_latest_run(tmp_path):
    args = ["run", "tiny-sd3", "--prompt", "a cat", "--seed", "0-1", "--steps", "2", "--warmup", "0",
            "--attention", "sdpa"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    run_dir = latest_run()
    assert run_dir.parent == tmp_path / "runs" and run_dir.name.startswith("tiny-sd3-")
    assert "2/2 sample(s) finished" in r.output and f"Output: {run_dir}" in r.output
    assert f"p000-s1: {run_dir}/samples/sdpa/p000-s1/image.png" in r.output
    assert RunDir(run_dir).variants == ["sdpa"]
    assert RunDir(run_dir).manifest["attention"]["sage"] is None
    # the sage half of a comparison can be added later: same settings, same default run directory
    r = runner.invoke(app, args[:-2] + ["--attention", "sage"])
    assert r.exit_code == 0, r.output
    assert RunDir(run_dir).variants == ["sdpa", "sage"] and RunDir(run_dir).paired_ids() == ["p000-s0", "p000-s1"]
    # another kernel config is another run: a directory of its own
    r = runner.invoke(app, args[:-2] + ["--attention", "sage", "--kernel", "pv_precision=fp16"])
    assert r.exit_code == 0, r.output
    other = latest_run()
    assert other != run_dir and RunDir(other).manifest["attention"]["sage"]["pv_precision"] == "fp16"
