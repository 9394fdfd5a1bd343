"""The generation loop (sagegen/jobs/generate.py) with a fake pipeline: timings, saving, resume, sharding."""

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sagegen.jobs import generate
from sagegen.jobs.ranks import DistInfo, shard
from sagegen.jobs.generate import Job, RunDirConflict, generate_one, make_samples, merge_manifest, run_job
from sagegen.models.loading import Loaded
from sagegen.models.presets import resolve
from sagegen.runs.directory import RunDir


class FakePipe:
    """Calls `self.progress_bar(total=...)` like the diffusers pipelines; sleeps to make the phases measurable."""

    def __init__(self, video=True, pause=0.0, fail_at=None, nan=False):
        self.video, self.pause, self.fail_at, self.nan = video, pause, fail_at, nan
        self.calls = []

    def progress_bar(self, iterable=None, total=None):  # replaced by sagegen's step clock during a call
        raise AssertionError("sagegen should have replaced progress_bar")

    def __call__(self, prompt, num_inference_steps, guidance_scale, height, width, num_frames=None,
                 generator=None, output_type="pil", **kwargs):
        self.calls.append(dict(prompt=prompt, steps=num_inference_steps, seed=generator.initial_seed(),
                               output_type=output_type, **kwargs))
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise KeyboardInterrupt
        time.sleep(self.pause)  # "text encoding"
        with self.progress_bar(total=num_inference_steps) as bar:
            for _ in range(num_inference_steps):
                time.sleep(self.pause)
                bar.update()
        time.sleep(2 * self.pause)  # "decoding"
        shape = (1, num_frames, height, width, 3) if self.video else (1, height, width, 3)
        x = torch.rand(shape, generator=generator).numpy()
        if self.nan:
            x[..., 0, 0, :] = np.nan
        return SimpleNamespace(frames=x) if self.video else SimpleNamespace(images=x)


def _settings(preset, **kw):
    s = {"steps": 3, "frames": 5 if preset.is_video else None, "height": 16, "width": 16, "guidance": 1.0,
         "negative_prompt": None, "dtype": "float32", "max_sequence_length": None}
    s.update(kw)
    return s


def _job(tmp_path, model="tiny-cogvideox", variants=("sdpa",), prompts=("a", "b", "c"), seeds=(0,), **kw):
    preset = resolve(model)
    return Job(preset=preset, settings=_settings(preset, **kw.pop("settings", {})),
               samples=make_samples(list(prompts), list(seeds)), variants=list(variants), out=tmp_path / "run",
               warmup=kw.pop("warmup", 0), device="cpu", command=["sagegen", "test"], **kw)


def _loader(pipe):
    return lambda job, device: Loaded(pipe=pipe, source="fake", load_s=0.0)


def test_make_samples_ids():
    ids = [s.id for s in make_samples(["x", "y"], [0, 42])]
    assert ids == ["p000-s0", "p000-s42", "p001-s0", "p001-s42"]


def test_generate_one_splits_encode_denoise_decode():
    pipe = FakePipe(pause=0.05)
    preset = resolve("tiny-cogvideox")
    loaded = Loaded(pipe=pipe, source="fake", load_s=0.0)
    seen = []
    frames, t, finite = generate_one(loaded, preset, _settings(preset, steps=4), make_samples(["p"], [3])[0],
                                     torch.device("cpu"), on_step=lambda d, n: seen.append((d, n)))
    assert frames.dtype == np.uint8 and frames.shape == (5, 16, 16, 3) and finite
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert 0.04 <= t["encode_s"] < 0.15
    assert 0.19 <= t["denoise_s"] < 0.45 and t["step_s"] == pytest.approx(t["denoise_s"] / 4, rel=1e-3)
    assert 0.09 <= t["decode_s"] < 0.25
    assert t["total_s"] == pytest.approx(t["encode_s"] + t["denoise_s"] + t["decode_s"], abs=0.01)
    assert pipe.calls[0]["seed"] == 3 and pipe.calls[0]["output_type"] == "np"
    assert "progress_bar" not in vars(pipe)  # the instance override is removed again


def test_run_job_layout_manifest_and_resume(tmp_path):
    pipe = FakePipe()
    job = _job(tmp_path, variants=("sdpa",), seeds=(0, 1))
    res = run_job(job, loader=_loader(pipe), dist=DistInfo())
    assert res.generated == {"sdpa": 6} and len(pipe.calls) == 6
    rd = RunDir(res.run_dir)
    m = rd.manifest
    assert m["schema"] == 1 and m["variants"] == ["sdpa"] and len(m["samples"]) == 6
    assert set(m["timings"]["sdpa"]) == {s.id for s in job.samples}
    assert m["model"]["kind"] == "video" and m["model"]["name"] == "tiny-cogvideox"
    assert m["attention"]["sage"] is None and m["command"] == ["sagegen", "test"]
    s = rd.sample("sdpa", "p001-s1")
    assert s["prompt"] == "b" and s["seed"] == 1 and s["n_frames"] == 5 and "save_s" in s["timings"]
    assert rd.video_path("sdpa", "p001-s1").is_file() and len(rd.frames("sdpa", "p001-s1")) == 5
    # same command again: everything is skipped, nothing is loaded
    res2 = run_job(job, loader=lambda *a: pytest.fail("nothing left to generate, so nothing to load"),
                   dist=DistInfo())
    assert res2.generated == {"sdpa": 0} and res2.skipped == {"sdpa": 6}


def test_interrupted_run_keeps_finished_samples_and_resumes(tmp_path):
    job = _job(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_job(job, loader=_loader(FakePipe(fail_at=2)), dist=DistInfo())
    rd = RunDir(tmp_path / "run")
    assert rd.sample_ids("sdpa") == ["p000-s0"]
    assert list(rd.manifest["timings"]["sdpa"]) == ["p000-s0"]
    pipe = FakePipe()
    res = run_job(job, loader=_loader(pipe), dist=DistInfo())
    assert [c["prompt"] for c in pipe.calls] == ["b", "c"] and res.skipped == {"sdpa": 1}
    assert rd.sample_ids("sdpa") == ["p000-s0", "p001-s0", "p002-s0"]


def test_sage_variant_patches_and_unpatches(tmp_path, monkeypatch):
    events = []

    def fake_patch(pipe, config, **kw):
        events.append(("patch", config.smooth_v, kw.get("backend")))

    monkeypatch.setattr(generate, "_patcher", lambda: (fake_patch, lambda pipe: events.append(("unpatch",))))
    pipe = FakePipe()
    job = _job(tmp_path, variants=("sdpa", "sage"), prompts=("a",), warmup=1)
    res = run_job(job, loader=_loader(pipe), dist=DistInfo())
    assert res.generated == {"sdpa": 1, "sage": 1}
    assert events == [("patch", True, "auto"), ("unpatch",)]
    assert [c["steps"] for c in pipe.calls] == [2, 3, 2, 3]  # warm-up (2 steps) then the timed sample, per variant
    m = res.manifest
    assert m["variants"] == ["sdpa", "sage"] and m["attention"]["sage"]["smooth_v"] is True
    assert set(m["setup"]) == {"sdpa", "sage"} and m["setup"]["sage"]["rank0"]["warmup_s"] >= 0


def test_conflicting_settings_are_refused(tmp_path):
    run_job(_job(tmp_path, prompts=("a",)), loader=_loader(FakePipe()), dist=DistInfo())
    with pytest.raises(RunDirConflict, match="settings.steps: 3 -> 5"):
        run_job(_job(tmp_path, prompts=("a",), settings={"steps": 5}), loader=_loader(FakePipe()), dist=DistInfo())
    with pytest.raises(RunDirConflict, match="samples"):
        run_job(_job(tmp_path, prompts=("a", "z")), loader=_loader(FakePipe()), dist=DistInfo())


def test_merge_manifest_adds_variants_and_checks_attention(tmp_path):
    base = {"model": {"name": "m"}, "settings": {"steps": 1}, "samples": [], "created": "t0", "variants": ["sdpa"],
            "attention": {"sage": None, "policy": None}, "setup": {"sdpa": {}}}
    sage = dict(base, created="t1", variants=["sage"], attention={"sage": {"smooth_v": True}, "policy": None})
    merged = merge_manifest(base, sage, tmp_path)
    assert merged["variants"] == ["sdpa", "sage"] and merged["created"] == "t0" and merged["setup"] == {"sdpa": {}}
    other = dict(sage, attention={"sage": {"smooth_v": False}, "policy": None})
    with pytest.raises(RunDirConflict, match="attention.sage.smooth_v"):
        merge_manifest(merged, other, tmp_path)


def test_two_processes_share_one_run_directory(tmp_path):
    job = _job(tmp_path, prompts=("a", "b", "c", "d", "e"))
    pipes = [FakePipe(), FakePipe()]
    for rank in (1, 0):  # the order processes finish in does not matter
        res = run_job(job, loader=_loader(pipes[rank]), dist=DistInfo(rank=rank, world_size=2))
    assert [c["prompt"] for c in pipes[0].calls] == ["a", "c", "e"]
    assert [c["prompt"] for c in pipes[1].calls] == ["b", "d"]
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert sorted(m["timings"]["sdpa"]) == [f"p00{i}-s0" for i in range(5)]
    assert {s["rank"] for s in RunDir(res.run_dir).samples("sdpa")} == {0, 1}
    assert shard(list(range(5)), DistInfo(rank=1, world_size=2)) == [1, 3]


def test_image_model_and_nonfinite_output(tmp_path):
    job = _job(tmp_path, model="tiny-flux", prompts=("a",))
    res = run_job(job, loader=_loader(FakePipe(video=False, nan=True)), dist=DistInfo())
    rd = RunDir(res.run_dir)
    s = rd.sample("sdpa", "p000-s0")
    assert s["n_frames"] == 1 and s["fps"] is None and s["nonfinite"] is True
    assert rd.image_path("sdpa", "p000-s0").is_file() and not rd.video_path("sdpa", "p000-s0").exists()


def test_default_run_dir_is_stable_and_under_runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    a = _job(tmp_path)
    a.out = None
    b = _job(tmp_path)
    b.out = None
    assert a.resolve_out() == b.resolve_out()
    assert a.resolve_out().parent == tmp_path / "runs" and a.resolve_out().name.startswith("tiny-cogvideox-")
    c = _job(tmp_path, settings={"steps": 9})
    c.out = None
    assert c.resolve_out() != a.resolve_out()


def test_compile_runs_once_per_variant_before_warmup(tmp_path, monkeypatch):
    order = []
    monkeypatch.setattr(generate, "_compile", lambda pipe: order.append("compile"))
    monkeypatch.setattr(generate, "_patcher", lambda: (lambda *a, **k: order.append("patch"),
                                                        lambda pipe: order.append("unpatch")))
    pipe = FakePipe()
    job = _job(tmp_path, variants=("sdpa", "sage"), prompts=("a",), warmup=1, compile=True)
    res = run_job(job, loader=_loader(pipe), dist=DistInfo())
    assert order == ["compile", "patch", "compile", "unpatch"]
    assert all("compile_s" in res.manifest["setup"][v]["rank0"] for v in ("sdpa", "sage"))
    assert res.manifest["runtime"]["compile"] is True


def test_memory_savers_are_switched_on():
    from sagegen.models import tiny
    from sagegen.models.loading import place

    pipe = tiny.build_tiny_pipeline("cogvideox")
    notes = place(pipe, torch.device("cpu"), vae_tiling=True, vae_slicing=True)
    assert notes == [] and pipe.vae.use_tiling and pipe.vae.use_slicing
    pipe = SimpleNamespace(vae=SimpleNamespace(), to=lambda device: None)  # a VAE without the savers
    notes = place(pipe, torch.device("cpu"), vae_slicing=True)  # reported, not fatal
    assert len(notes) == 1 and "enable_slicing" in notes[0]
    with pytest.raises(ValueError, match="offload"):
        place(pipe, torch.device("cpu"), offload="disk")


def test_load_time_goes_to_the_first_variant_that_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "_patcher", lambda: (lambda *a, **k: None, lambda pipe: None))
    job = _job(tmp_path, variants=("sdpa",), prompts=("a",))
    run_job(job, loader=_loader(FakePipe()), dist=DistInfo())
    both = _job(tmp_path, variants=("sdpa", "sage"), prompts=("a",))
    loader = lambda job, device: Loaded(pipe=FakePipe(), source="fake", load_s=1.5)  # noqa: E731
    res = run_job(both, loader=loader, dist=DistInfo())
    assert res.generated == {"sdpa": 0, "sage": 1}
    assert res.manifest["setup"]["sage"]["rank0"]["load_s"] == 1.5
