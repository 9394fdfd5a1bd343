"""`--cp`: parsing and the checks that run before any weights load (exit 2 on mistakes)."""

import pytest

from sagegen.cli.cp_option import CpSpec, check_cp, parse_cp
from sagegen.cli.errors import UsageProblem
from sagegen.models.presets import resolve

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_parse():
    assert parse_cp("ulysses=2,ring=2") == CpSpec(2, 2)
    assert parse_cp(" Ring=4 ") == CpSpec(1, 4)
    assert parse_cp("ulysses=8").world == 8
    assert parse_cp("cfg=2") == CpSpec(1, 1, 2) and parse_cp("cfg=2,ulysses=2").world == 4
    assert CpSpec(2, 1, 2).to_dict() == {"ulysses": 2, "ring": 1, "cfg": 2}
    assert CpSpec(2, 2).to_dict() == {"ulysses": 2, "ring": 2}  # runs without cfg keep their hash
    for bad, why in [("ulysses=2,ulysses=2", "at most once"), ("u=2", "cfg=C,ulysses=U,ring=R"),
                     ("ring=x", "integer"), ("ring=0", "at least 1"), ("ulysses=1", "product"),
                     ("ulysses2", "cfg=C,ulysses=U,ring=R"), ("cfg=4", "two branches; use cfg=2"),
                     ("cfg=1", "product")]:
        with pytest.raises(UsageProblem, match=why):
            parse_cp(bad)


def test_checks_before_loading():
    env = dict(TORCHRUN)
    assert check_cp(None, resolve("hunyuanvideo"), environ=env) is None
    assert check_cp("ulysses=2,ring=2", resolve("hunyuanvideo"), environ=env) == CpSpec(2, 2)   # 24 heads
    assert check_cp("ring=4", resolve("flux.1-dev"), environ=env) == CpSpec(1, 4)
    with pytest.raises(UsageProblem, match="torchrun.*missing RANK, WORLD_SIZE"):
        check_cp("ring=2", resolve("flux.1-dev"), environ={})
    with pytest.raises(UsageProblem, match="= 2 processes, but torchrun started 4"):
        check_cp("ring=2", resolve("flux.1-dev"), environ=env)
    with pytest.raises(UsageProblem, match=r"heads \(2\) to be a multiple of the Ulysses degree"):
        check_cp("ulysses=4", resolve("tiny-flux"), environ=env)
    with pytest.raises(UsageProblem, match="CogVideoX.*scaled_dot_product_attention directly"):
        check_cp("ulysses=2,ring=2", resolve("cogvideox-5b"), environ=env)
    with pytest.raises(UsageProblem, match="Mochi"):
        check_cp("ulysses=2,ring=2", resolve("mochi-1"), environ=env)
    with pytest.raises(UsageProblem, match="SD3"):
        check_cp("ulysses=2,ring=2", resolve("sd3.5-large"), environ=env)
    with pytest.raises(UsageProblem, match="offload"):
        check_cp("ring=4", resolve("flux.1-dev"), offload="model", environ=env)


def test_cfg_checks_before_loading():
    """cfg=2: pipelines with classifier-free guidance (batched or two calls, with or without a sequence split);
    models with embedded guidance, guidance 1 and a wrong process count are usage errors."""
    two, four = dict(TORCHRUN, WORLD_SIZE="2"), dict(TORCHRUN)
    assert check_cp("cfg=2", resolve("wan2.1-t2v-14b"), environ=two) == CpSpec(1, 1, 2)
    assert check_cp("cfg=2", resolve("cogvideox-5b"), environ=two) == CpSpec(1, 1, 2)  # batched, no CP plan needed
    assert check_cp("cfg=2,ulysses=2", resolve("wan2.1-t2v-14b"), environ=four) == CpSpec(2, 1, 2)
    with pytest.raises(UsageProblem, match="guidance distillation.*ulysses=N"):
        check_cp("cfg=2", resolve("flux.1-dev"), environ=two)
    with pytest.raises(UsageProblem, match="embedded guidance"):
        check_cp("cfg=2", resolve("hunyuanvideo"), environ=two)
    with pytest.raises(UsageProblem, match="guidance 1.0 runs no unconditional branch"):
        check_cp("cfg=2", resolve("wan2.1-t2v-14b"), environ=two, guidance=1.0)
    with pytest.raises(UsageProblem, match="ulysses=1 x ring=1 x cfg=2 = 2 processes, but torchrun started 4"):
        check_cp("cfg=2,ulysses=1", resolve("wan2.1-t2v-14b"), environ=four)
    with pytest.raises(UsageProblem, match="CogVideoX.*scaled_dot_product_attention directly"):
        check_cp("cfg=2,ulysses=2", resolve("cogvideox-5b"), environ=four)  # the sequence split still needs a plan


def test_what_an_older_diffusers_lacks_is_a_usage_error(monkeypatch):
    """diffusers < 0.36 has no context parallelism, and 0.36 refuses Ulysses with Ring (its own ValueError): both
    are said before loading, naming the diffusers version (simulated on the installed one)."""
    import dataclasses

    import diffusers

    env = dict(TORCHRUN)
    monkeypatch.setattr(diffusers, "__version__", "0.36.0")
    real = diffusers.ContextParallelConfig

    @dataclasses.dataclass
    class Refusing(real):
        def __post_init__(self):
            if (self.ulysses_degree or 1) > 1 and (self.ring_degree or 1) > 1:
                raise ValueError("Unified Ulysses-Ring attention is not yet supported.")
            super().__post_init__()

    monkeypatch.setattr(diffusers, "ContextParallelConfig", Refusing)
    with pytest.raises(UsageProblem, match=r"diffusers 0\.36\.0 refuses ulysses=2, ring=2.*Unified"):
        check_cp("ulysses=2,ring=2", resolve("hunyuanvideo"), environ=env)
    assert check_cp("ring=4", resolve("flux.1-dev"), environ=env) == CpSpec(1, 4)
    monkeypatch.delattr(diffusers.ModelMixin, "enable_parallelism")  # (the lazy module would re-import a name)
    with pytest.raises(UsageProblem, match=r"diffusers 0\.36\.0 has no context parallelism.*prompt sharding"):
        check_cp("ring=4", resolve("flux.1-dev"), environ=env)


def _env(tmp_path):
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), CUDA_VISIBLE_DEVICES="",
               SAGEGEN_RUNS=str(tmp_path / "runs"), OMP_NUM_THREADS="1")
    for k in ("SAGEGEN_DEBUG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _torchrun(tmp_path, *args: str, env: dict | None = None) -> tuple:
    """``torchrun --nproc-per-node 2 -m sagegen.cli.app ARGS --out tmp_path/run`` on gloo; it must exit 0.
    Returns (the run's manifest, its RunDir)."""
    import json
    import subprocess
    import sys

    from sagegen.runs.directory import RunDir

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "sagegen.cli.app", *args, "--out", str(out)]
    proc = subprocess.run(cmd, env=env or _env(tmp_path), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rd = RunDir(out)
    return json.loads(rd.manifest_path.read_text()), rd


def test_cp_without_torchrun_exits_2_before_loading(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sagegen.cli.app", "run", "tiny-flux", "--prompt", "x", "--cp", "ring=2",
           "--out", str(out)]
    proc = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--cp" in proc.stderr and "torchrun" in proc.stderr
    assert not out.exists()
    # under torchrun (its variables set, WORLD_SIZE 2), each process refuses a model that cannot run CP
    cmd[cmd.index("tiny-flux")] = "tiny-cogvideox"
    env = {**_env(tmp_path), **TORCHRUN, "WORLD_SIZE": "2"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "scaled_dot_product_attention directly" in proc.stderr, proc.stderr[-2000:]


def test_cp_launch_hint_is_a_command_that_runs(tmp_path):
    """Issue 54: the hint without torchrun is this very command under `torchrun -m sagegen` (a bare `sagegen`
    is taken for a script and fails); run as printed (with --help, so nothing generates), it starts sagegen on
    every rank. Told at once: the check needs no torch."""
    import re
    import shlex
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "sagegen", "run", "tiny-flux", "-p", "a fox", "--cp", "ring=2", "--steps", "1"]
    proc = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    hint = re.search(r"launch as (torchrun .*)$", " ".join(proc.stderr.split())).group(1)
    assert hint == "torchrun --nproc-per-node 2 -m sagegen run tiny-flux -p 'a fox' --cp ring=2 --steps 1"
    argv = shlex.split(hint)
    launched = [sys.executable, "-m", "torch.distributed.run", "--standalone", *argv[1:], "--help"]
    proc = subprocess.run(launched, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("Usage: sagegen run") == 2  # both ranks ran the sagegen command


@pytest.mark.slow
def test_compare_with_cp_ulysses_2_under_torchrun(tmp_path):
    """Two gloo processes split one sample's sequence: both run it, rank 0 writes it once."""
    m, rd = _torchrun(tmp_path, "compare", "tiny-hunyuanvideo", "--prompt", "a cat", "--steps", "2", "--warmup", "0",
                      "--quiet", "--cp", "ulysses=2")
    assert m["settings"]["cp"] == {"ulysses": 2, "ring": 1}
    for v in ("sdpa", "sage"):
        assert sorted(m["timings"][v]) == ["p000-s0"]
        assert {s["rank"] for s in rd.samples(v)} == {0}
        assert m["setup"][v]["rank1"]["cp"]["ulysses"] == 2
    assert m["setup"]["sage"]["rank0"]["cp"]["attention_backend"].startswith("sagegen")
    assert m["setup"]["sdpa"]["rank0"]["cp"]["attention_backend"] == "native"


@pytest.mark.slow
def test_run_hunyuanvideo_sparse_under_ulysses(tmp_path):
    """`torchrun ... run tiny-hunyuanvideo --cp ulysses=2 --sparse ...` (bf16, the kernels interpreted): on both
    ranks every joint call takes the fused prologue, goes through sagegen's CP and runs block-sparse, and the
    manifest records each rank's realized density."""
    m, _ = _torchrun(tmp_path, "run", "tiny-hunyuanvideo", "--prompt", "a cat", "--steps", "2", "--quiet", "--cp",
                     "ulysses=2", "--dtype", "bfloat16", "--height", "64", "--width", "64", "--sparse",
                     "topk=0.5,steps=0,blocks=none,min_tokens=0", env=dict(_env(tmp_path), TRITON_INTERPRET="1"))
    for rank in ("rank0", "rank1"):
        setup = m["setup"]["sage"][rank]
        calls = setup["attention_calls"]
        # 2 steps x (a dual and a single block): fused, split and sparse; the token refiner stays dense
        assert calls["fused_qk_prologue"] == calls["context_parallel"] == calls["sparse_calls"] == 4, calls
        assert 0 < setup["sparse"]["density"]["overall"] <= 1, setup["sparse"]


def test_presets_of_the_newer_classes():
    env = dict(TORCHRUN, WORLD_SIZE="2")
    assert check_cp("ulysses=2", resolve("tiny-hunyuanvideo-1.5"), environ=env) == CpSpec(2, 1)   # sagegen's plan
    assert check_cp("ring=2", resolve("tiny-hunyuanvideo-1.5"), environ=env) == CpSpec(1, 2)
    assert check_cp("ulysses=2", resolve("tiny-qwen-image"), environ=env) == CpSpec(2, 1)
    # the tiny denoisers have 2 heads: found from their config, so Ulysses 4 is refused before loading
    with pytest.raises(UsageProblem, match=r"heads \(2\) to be a multiple of the Ulysses degree"):
        check_cp("ulysses=4", resolve("tiny-hunyuanvideo-1.5"), environ=dict(TORCHRUN))
    assert check_cp("ulysses=2,ring=2", resolve("hunyuanvideo-1.5"), environ=dict(TORCHRUN)) == CpSpec(2, 2)


@pytest.mark.slow
def test_run_hunyuanvideo15_ring_2_under_torchrun(tmp_path):
    """The tiny HunyuanVideo-1.5 pipeline (its text: Qwen + ByT5 + image tokens, padded by sagegen's hook)
    under Ring 2: every main-block attention call goes through sagegen's CP."""
    m, _ = _torchrun(tmp_path, "run", "tiny-hunyuanvideo-1.5", "--prompt", "a cat", "--steps", "2", "--quiet",
                     "--cp", "ring=2")
    out = tmp_path / "run"
    assert m["settings"]["cp"] == {"ulysses": 1, "ring": 2}
    for rank in ("rank0", "rank1"):
        calls = m["setup"]["sage"][rank]["attention_calls"]
        assert calls.get("context_parallel", 0) > 0 and not calls.get("fallback"), calls
    assert (out / "samples" / "sage" / "p000-s0" / "video.mp4").stat().st_size > 0


@pytest.mark.slow
def test_run_hunyuanvideo15_sparse_under_ulysses(tmp_path):
    """`torchrun ... run tiny-hunyuanvideo-1.5 --cp ulysses=2 --sparse ...`: on both ranks every main-block call
    goes through sagegen's CP (its key-mask call on the patch's backend route, with its segments) and runs
    block-sparse; the manifest records each rank's density."""
    # one step: the interpreter's cost is per step, and step 0 is already sparse (steps=0)
    m, _ = _torchrun(tmp_path, "run", "tiny-hunyuanvideo-1.5", "--prompt", "a cat", "--steps", "1", "--quiet",
                     "--cp", "ulysses=2", "--sparse", "topk=0.5,steps=0,blocks=none,min_tokens=0")
    for rank in ("rank0", "rank1"):
        setup = m["setup"]["sage"][rank]
        calls = setup["attention_calls"]
        # 1 step x 2 main blocks (with CFG as its guider runs it), split and sparse; the refiner stays dense
        assert calls.get("sparse_calls", 0) >= 2 and calls["sparse_calls"] == calls["context_parallel"], calls
        assert not calls.get("sparse_dense_unordered") and not calls.get("fallback"), calls
        assert 0 < setup["sparse"]["density"]["overall"] <= 1, setup["sparse"]


@pytest.mark.slow
@pytest.mark.parametrize("model,parts", [("tiny-wan2.1", 1), ("tiny-hunyuanvideo", 2)])
def test_run_sparse_under_ring(tmp_path, model, parts):
    """`torchrun ... run MODEL --cp ring=2 --sparse ...`: on both ranks every self-attention call goes through
    sagegen's CP, which attends once over the gathered keys with the rank's queries as a window, and runs
    block-sparse (HunyuanVideo's joint calls: keys in one process's order, the video and the text rows in a
    call each); Wan's cross-attention stays local and dense; the manifest records each rank's density."""
    m, _ = _torchrun(tmp_path, "run", model, "--prompt", "a cat", "--steps", "2", "--quiet", "--cp", "ring=2",
                     "--sparse", "topk=0.5,steps=0,blocks=none,min_tokens=0")
    out = tmp_path / "run"
    assert m["settings"]["cp"] == {"ulysses": 1, "ring": 2}
    for rank in ("rank0", "rank1"):
        setup = m["setup"]["sage"][rank]
        calls = setup["attention_calls"]
        assert calls.get("sparse_calls", 0) >= 2 and calls["sparse_calls"] == parts * calls["context_parallel"], calls
        assert not calls.get("sparse_dense_unordered") and not calls.get("fallback"), calls
        assert 0 < setup["sparse"]["density"]["overall"] <= 1, setup["sparse"]
    assert (out / "samples" / "sage" / "p000-s0" / "video.mp4").stat().st_size > 0


@pytest.mark.slow
def test_bench_cp_smoke_reuses_its_one_gpu_baselines(tmp_path):
    """bench/bench_cp.py on two gloo processes (the --cpu-smoke models): the first launch measures and keeps
    the one-process baselines, a second launch with another split (and fewer variants) reuses them; both reports
    are complete, and Ulysses stays within sagegen's own error of one process."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "bench_cp.py"
    reports = {}
    for cp in ("ulysses=2", "ring=2"):
        out = tmp_path / f"{cp}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
               "--cpu-smoke", "--model", "hunyuanvideo", "--cp", cp, "--repeats", "1",
               "--baseline-dir", str(tmp_path / "base"), "--out", str(out)]
        cmd += ["--patched", "attention"] if cp == "ulysses=2" else []
        proc = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        reports[cp] = json.loads(out.read_text())["models"]["hunyuanvideo"]
    first, second = reports["ulysses=2"], reports["ring=2"]
    assert "reused_from" not in first["single"]["sagegen"] and "reused_from" in second["single"]["sagegen"]
    assert second["single"]["sagegen"]["median_s"] == first["single"]["sagegen"]["median_s"]
    assert "sagegen_patched" in first["single"] and set(second["single"]) == {"sagegen", "stock"}
    uly = first["cp"]["ulysses=2"]
    assert uly["sagegen"]["vs_1gpu_sagegen"]["finite"] and uly["sagegen"]["vs_1gpu_sagegen"]["rel_l1"] < 0.02
    assert uly["stock"]["vs_1gpu_same_backend"]["rel_l1"] < 1e-4     # exact attention: the same to rounding
    ring = second["cp"]["ring=2"]
    assert ring["sagegen"]["vs_1gpu_sagegen"]["rel_l1"] < 0.02
    assert "return_lse" in ring["stock"]["error"]                      # diffusers' native backend has no Ring


def test_sparse_with_cp_for_video_self_attention_and_joint_calls(monkeypatch, tmp_path):
    """--sparse runs under --cp where the patch hands self-attention to the split in one process's order (Wan's
    and LTX-Video's video-only calls, HunyuanVideo's and HunyuanVideo-1.5's joint calls), under any split;
    other models exit 2 before loading."""
    from sagegen.cli.jobs import build_job

    for k, v in dict(TORCHRUN, WORLD_SIZE="2").items():
        monkeypatch.setenv(k, v)

    def job(model, cp, sparse="topk=0.5"):
        return build_job(model=model, variants=["sage"], prompt=["a cat"], prompts=None, max_prompts=None,
                         seed=None, steps=1, frames=None, height=None, width=None, guidance=None,
                         negative_prompt=None, dtype="auto", device="cpu", model_path=None, random_weights=False,
                         offload="none", vae_tiling=False, vae_slicing=False, compile=False, warmup=0, kernel=None,
                         fp_blocks=None, fp_first_steps=0, fp_last_steps=0, backend="auto", out=tmp_path / "run",
                         linear="fp8", sparse=sparse, cp=cp)

    j, _ = job("tiny-wan2.1", "ulysses=2")
    assert j.sparse.value == 0.5 and j.linear == "fp8" and j.settings["cp"] == {"ulysses": 2, "ring": 1}
    j, _ = job("tiny-hunyuanvideo", "ulysses=2")
    assert j.sparse.mode == "topk" and j.settings["cp"] == {"ulysses": 2, "ring": 1}
    assert job("tiny-hunyuanvideo", "ulysses=2", "sta")[0].sparse.mode == "sta"
    assert job("tiny-hunyuanvideo-1.5", "ulysses=2")[0].sparse.mode == "topk"
    assert job("tiny-ltx-video", "ulysses=2")[0].sparse.mode == "topk"
    assert job("tiny-wan2.1", "ring=2")[0].settings["cp"] == {"ulysses": 1, "ring": 2}
    assert job("tiny-ltx-video", "ring=2")[0].sparse.mode == "topk"
    assert job("tiny-hunyuanvideo", "ring=2")[0].settings["cp"] == {"ulysses": 1, "ring": 2}
    assert job("tiny-hunyuanvideo-1.5", "ring=2", "sta")[0].sparse.mode == "sta"
    with pytest.raises(UsageProblem, match="for Wan, LTX-Video, HunyuanVideo and HunyuanVideo-1.5 models.*flux"):
        job("tiny-flux", "ulysses=2")


@pytest.mark.slow
def test_compare_with_cfg_parallel_under_torchrun(tmp_path):
    """`--cp cfg=2` as documented: two gloo processes, one guidance branch each (tiny Wan runs its branches as
    two calls), both variants; rank 0 writes each sample once."""
    m, rd = _torchrun(tmp_path, "compare", "tiny-wan2.1", "--prompt", "a cat", "--steps", "2", "--warmup", "0",
                      "--quiet", "--cp", "cfg=2")
    assert m["settings"]["cp"] == {"ulysses": 1, "ring": 1, "cfg": 2}
    for v in ("sdpa", "sage"):
        assert sorted(m["timings"][v]) == ["p000-s0"]
        assert {s["rank"] for s in rd.samples(v)} == {0}
        assert m["setup"][v]["rank1"]["cp"]["cfg"] == 2


@pytest.mark.slow
def test_a_fixed_step_cache_under_ulysses_matches_one_process(tmp_path):
    """`--cache taylorseer=2 --cp ulysses=2`: both ranks keep the same schedule as one process does, stock's frames
    are one process's frames exactly, and sagegen's differ from one process's by no more than sagegen's own error
    (the split changes fp32 rounding, not the cache's decisions)."""
    import json
    import subprocess
    import sys

    import numpy as np

    from sagegen.runs.reader import load_frames, load_run

    args = ["compare", "tiny-hunyuanvideo", "--prompt", "a cat", "--steps", "5", "--warmup", "0", "--quiet",
            "--cache", "taylorseer=2"]
    m, _ = _torchrun(tmp_path / "cp", *args, "--cp", "ulysses=2")
    one = tmp_path / "one"
    proc = subprocess.run([sys.executable, "-m", "sagegen.cli.app", *args, "--out", str(one)], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m1 = json.loads((one / "manifest.json").read_text())
    for v in ("sdpa", "sage"):
        single = m1["setup"][v]["rank0"]["cache"]["schedule"]
        assert single["attention_work"] < 1.0, single  # the cache skipped something
        for rank in ("rank0", "rank1"):
            assert m["setup"][v][rank]["cache"]["schedule"] == single, (v, rank)
    cp_run, one_run = load_run(tmp_path / "cp" / "run"), load_run(one)
    frames = {(name, v): load_frames(r.samples[0].frame_paths(v)).astype(np.float64)
              for name, r in (("cp", cp_run), ("one", one_run)) for v in ("sdpa", "sage")}
    assert np.array_equal(frames["cp", "sdpa"], frames["one", "sdpa"])
    split = np.abs(frames["cp", "sage"] - frames["one", "sage"]).mean()
    quant = np.abs(frames["one", "sage"] - frames["one", "sdpa"]).mean()
    assert 0 < quant and split <= 1.5 * quant, (split, quant)
