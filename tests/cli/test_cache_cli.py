"""`--cache` on the CLI: usage errors (exit 2, before loading), and `compare --cache` on a tiny model writing the
realised schedule of both variants into the manifest and the HTML report."""

import re

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.patch import cache_spec, cachedit
from sagegen.runs.directory import RunDir

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("isolated")


@pytest.mark.parametrize("args,match", [
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "lru=2"], "write one of fbcache=THRESHOLD"),
    (["compare", "tiny-wan2.1", "-p", "x", "--cache", "fbcache=-1"], "must be > 0"),
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "magcache=/nonexistent/m.json"], "no such file"),
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "taylorseer=interval:0"], "must be >= 1"),
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "fastercache=2"], "batched call .* this model is wan"),
    (["compare", "tiny-flux", "-p", "x", "--cache", "seacache=0.2"], "Wan text-to-video only; this model is flux"),
    (["run", "tiny-cogvideox", "-p", "x", "--cache", "fastercache=spatial:0"], "must be >= 1"),
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "seacache=order:3"], "must be one of 0, 1"),
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "cachedit=Fn:0"], "must be >= 1"),
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "cachedit=warp:2"], "write Fn:N,Bn:N"),
    (["run", "tiny-wan2.1", "-p", "x", "--steps", "4", "--cache", "cachedit=mask:110"],
     "has 3 steps, this run has 4"),
])
def test_cache_usage_errors_exit_2(args, match, fake_model):
    if "cachedit" in args[-1] and cachedit.installed_version() is None:
        pytest.skip(f"cache-dit is not installed ({cachedit.INSTALL})")
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "--cache" in r.output and re.search(match, r.output), r.output
    assert fake_model.loads == []


TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("cp,cache,refused", [
    ("ulysses=2", "fbcache=0.1", True),    # each rank would judge its own shard's first-block residual
    ("ring=2", "seacache=0.2", True),
    ("ulysses=2", "taylorseer=2", False),  # a schedule fixed by the step: the same on every rank
    ("ring=2", "pab=2", False),
])
def test_a_cache_that_decides_per_rank_is_refused_under_a_sequence_split(monkeypatch, cp, cache, refused):
    from sagegen.cli import jobs
    from sagegen.cli.errors import UsageProblem

    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    kwargs = dict(model="tiny-wan2.1", variants=["sage"], prompt=["x"], prompts=None, max_prompts=None, seed="0",
                  steps=4, frames=None, height=None, width=None, guidance=None, negative_prompt=None, dtype="auto",
                  device="cpu", model_path=None, random_weights=False, offload="none", vae_tiling=False,
                  vae_slicing=False, compile=False, warmup=0, kernel=None, fp_blocks=None, fp_first_steps=0,
                  fp_last_steps=0, backend="reference", out=None, linear="none", sparse=None, cp=cp, cuda_graphs=False,
                  cache=cache, writes_run_dir=False)
    if refused:
        with pytest.raises(UsageProblem, match="decides from each rank's own part of the sequence"):
            jobs.build_job(**kwargs)
    else:
        job, _ = jobs.build_job(**kwargs)
        assert job.settings["cache"]["kind"] == cache.split("=")[0]
    spec = cache_spec.parse(cache)  # CFG parallelism alone: ranks run whole calls, any cache is fine
    cache_spec.check_parallel(spec, sequence_split=False)


def test_a_cache_this_install_lacks_exits_2(monkeypatch, fake_model):
    monkeypatch.setattr(cachedit, "installed_version", lambda: None)
    r = runner.invoke(app, ["run", "tiny-wan2.1", "-p", "x", "--cache", "cachedit=Fn:1"])
    assert r.exit_code == 2 and "pip install 'sagegen[cachedit]'" in r.output, r.output
    monkeypatch.setattr(cache_spec, "_diffusers_release", lambda: (0, 40, 0))
    r = runner.invoke(app, ["run", "tiny-wan2.1", "-p", "x", "--cache", "seacache=0.2"])
    assert r.exit_code == 2 and "needs diffusers >= 0.41; this is diffusers 0.40.0" in r.output, r.output
    assert fake_model.loads == []


def test_magcache_file_for_other_steps_exits_2(tmp_path, fake_model):
    import json

    ratios = tmp_path / "mag.json"
    ratios.write_text(json.dumps([1.0, 0.98, 0.97]))
    r = runner.invoke(app, ["run", "tiny-wan2.1", "-p", "x", "--steps", "4", "--cache", f"magcache={ratios}"])
    assert r.exit_code == 2 and "holds 3 ratios" in r.output, r.output
    assert fake_model.loads == []


def test_compare_cache_records_the_schedule_in_manifest_and_report(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["compare", "tiny-wan2.1", "-p", "a red fox", "--steps", "5", "--warmup", "0",
                            "--backend", "reference", "--cache", "taylorseer=interval:2,warmup:1", "--quiet",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    manifest = RunDir(out).manifest
    assert manifest["settings"]["cache"] == {"kind": "taylorseer", "interval": 2, "order": 1, "warmup": 1}
    schedules = {}
    for variant in ("sdpa", "sage"):
        cache = manifest["setup"][variant]["rank0"]["cache"]
        sched = cache["schedule"]
        assert sched["calls"] == 10  # 5 steps, guidance in two calls
        assert sched["blocks"] == [sched["blocks_per_call"]] * 10
        assert 0 < sched["attention_work"] < 1, sched  # some calls predicted their attention
        schedules[variant] = sched["attention"]
    assert schedules["sdpa"] == schedules["sage"]  # a fixed schedule: the same calls computed either way
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    html = (out / "report" / "report.html").read_text()
    assert "Step cache" in html and "attention modules computed" in html


def test_calibrate_magcache_then_run_with_it(tmp_path):
    """`calibrate --cache magcache` writes one ratio per step (the first 1.0) from sagegen-patched uncached
    generations; `compare --cache magcache=FILE` takes the file at the same steps."""
    import json

    path = tmp_path / "mag.json"
    r = runner.invoke(app, ["calibrate", "tiny-wan2.1", "-p", "a red fox", "--seed", "0-1", "--steps", "4",
                            "--backend", "reference", "--cache", "magcache", "--out", str(path)])
    assert r.exit_code == 0, r.output
    data = json.loads(path.read_text())
    assert data["steps"] == 4 and len(data["mag_ratios"]) == 4 and data["mag_ratios"][0] == 1.0
    assert data["runs"] == 2 and set(data["streams"]) == {"0", "1"}  # Wan: conditional and unconditional calls
    assert all(r > 0 for r in data["mag_ratios"])
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "tiny-wan2.1", "-p", "a red fox", "--steps", "4", "--warmup", "0",
                            "--backend", "reference", "--cache", f"magcache={path}", "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    sched = RunDir(out).manifest["setup"]["sage"]["rank0"]["cache"]["schedule"]
    assert sched["calls"] == 8 and sched["blocks"][0] == sched["blocks_per_call"]


def test_compare_cachedit_records_its_cached_steps(tmp_path):
    """cache-dit with a fixed schedule (a 0/1 mask, static): both variants cache step 2 of 4 (0-based); the
    manifest has the recorder's block counts and cache-dit's own cached steps."""
    pytest.importorskip("cache_dit")
    out = tmp_path / "run"
    spec = "cachedit=Fn:1,Bn:0,warmup:0,mask:1101,policy:static"
    r = runner.invoke(app, ["compare", "tiny-wan2.1", "-p", "a red fox", "--steps", "4", "--warmup", "0",
                            "--backend", "reference", "--cache", spec, "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    manifest = RunDir(out).manifest
    assert manifest["settings"]["cache"] == {"kind": "cachedit", "Fn": 1, "Bn": 0, "threshold": 0.08, "warmup": 0,
                                             "mask": "1101", "policy": "static", "steps": 4}
    for variant in ("sdpa", "sage"):
        sched = manifest["setup"][variant]["rank0"]["cache"]["schedule"]
        full = sched["blocks_per_call"]
        assert sched["blocks"] == [full] * 4 + [1, 1] + [full] * 2, sched  # guidance in two calls a step
        assert [c["cached_steps"] for c in sched["cachedit"]] == [[2]]
        assert [c["cfg_cached_steps"] for c in sched["cachedit"]] == [[2]]
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    html = (out / "report" / "report.html").read_text()
    assert "cache-dit's cached steps (0-based, the last generation): steps [2], unconditional calls: steps [2]" \
        in html


def test_run_fastercache_on_cogvideox(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "tiny-cogvideox", "-p", "a red fox", "--steps", "4", "--warmup", "0",
                            "--backend", "reference", "--cache", "fastercache=spatial:2,uncond:2", "--quiet",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    sched = RunDir(out).manifest["setup"]["sage"]["rank0"]["cache"]["schedule"]
    assert sched["calls"] == 4 and sched["attention_work"] < 1, sched  # batched guidance: one call a step
