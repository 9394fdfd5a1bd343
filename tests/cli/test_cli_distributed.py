"""Several processes: launcher detection, a real 2-process `torchrun` compare on the CPU (gloo), and a
context-parallel run whose rank 0 fails."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import cp_abort_launch
from sagegen.jobs import ranks as distributed
from sagegen.runs.directory import RunDir


def test_info_reads_torchrun_and_accelerate_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("ACCELERATE_", "TORCHELASTIC_")) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(k)
    assert distributed.info() == distributed.DistInfo()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    d = distributed.info()
    assert (d.rank, d.world_size, d.local_rank, d.launcher, d.is_main) == (3, 4, 1, "torchrun", False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert distributed.info().launcher == "accelerate"
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="RANK=4, WORLD_SIZE=4"):
        distributed.info()


def test_shard_is_round_robin_and_complete():
    items = list(range(7))
    shares = [distributed.shard(items, distributed.DistInfo(rank=r, world_size=3)) for r in range(3)]
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(sum(shares, [])) == items


def test_a_cp_job_on_cuda_gets_one_group_with_nccl(monkeypatch, tmp_path):
    """`execute` initializes the process group once, with NCCL for CUDA tensors when a --cp job runs on the GPU
    (a gloo-only group initialized first used to stay, and every CP collective on CUDA failed), and `init` refuses
    a group without a CUDA backend for such a job instead of letting the first collective fail."""
    import types

    import torch.distributed as td

    from sagegen.cli import jobs

    calls = []
    monkeypatch.setattr(distributed, "init", lambda dist, **kw: calls.append(kw) or False)
    monkeypatch.setattr(distributed, "info", lambda: distributed.DistInfo(rank=0, world_size=2, local_rank=0))
    monkeypatch.setattr(jobs, "_cuda_job", lambda job: True)
    monkeypatch.setattr("sagegen.jobs.generate.run_job", lambda job, reporter, dist: "done")
    settings = {"cp": "ulysses=2", "width": 64, "height": 64, "frames": 0, "steps": 1, "guidance": 1.0,
                "dtype": "bf16"}
    job = types.SimpleNamespace(settings=settings, preset=types.SimpleNamespace(name="tiny-flux"), samples=[1],
                                variants=["sagegen"], command="run", resolve_out=lambda: tmp_path / "out")
    assert jobs.execute(job, quiet=True, title="run") == "done"
    assert calls == [{"gpu_collectives": True}]

    monkeypatch.undo()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29541")
    one = distributed.DistInfo(rank=0, world_size=1, local_rank=0)
    monkeypatch.setattr(distributed.DistInfo, "enabled", property(lambda self: True))
    assert distributed.init(one)  # gloo only
    try:
        with pytest.raises(RuntimeError, match="needs a process group with NCCL"):
            distributed.init(one, gpu_collectives=True)
    finally:
        td.destroy_process_group()


@pytest.mark.slow
def test_compare_under_torchrun_with_two_processes(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), CUDA_VISIBLE_DEVICES="",
               SAGEGEN_RUNS=str(tmp_path / "runs"), OMP_NUM_THREADS="1")
    env.pop("SAGEGEN_DEBUG", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "sagegen.cli.app", "compare", "tiny-flux", "--prompts", "smoke", "--seed", "0", "--steps", "2",
           "--warmup", "0", "--quiet", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rd = RunDir(out)
    m = json.loads(rd.manifest_path.read_text())
    ids = [f"p00{p}-s0" for p in range(3)]  # three samples: two on one rank, one on the other
    assert m["runtime"]["world_size"] == 2
    for v in ("sdpa", "sage"):
        assert sorted(m["timings"][v]) == ids  # the manifest ends up whole
        assert {s["rank"] for s in rd.samples(v)} == {0, 1}  # and both processes did their share
        assert sorted(m["setup"][v]) == ["rank0", "rank1"]
    assert proc.stdout.count("sdpa vs sage") == 1  # only rank 0 prints the summary
    assert "[rank 1]" in proc.stderr  # the other rank reports its samples line by line (on stderr)


@pytest.mark.slow
def test_a_rank_that_fails_mid_run_ends_a_cp_run(tmp_path):
    """Rank 0's sample write fails while rank 1 is in the next sample's collectives: the launch ends with rank
    0's error instead of hanging (2 gloo processes; tests/patch/cp/test_gpu_cp.py runs the NCCL abort on 2 GPUs)."""
    proc, seconds = cp_abort_launch.launch(tmp_path, cuda=False)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert cp_abort_launch.INJECTED in proc.stdout + proc.stderr
    assert seconds < 240
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name or ".partial" in p.name]  # no half-written file


def test_an_error_aborts_a_gpu_group_instead_of_waiting_for_peers(monkeypatch):
    """After an error, a rank whose group has NCCL aborts it (destroying would wait for a peer stuck in a
    collective); a CPU-only group is destroyed as before, and a clean end still waits at the barrier."""
    import torch.distributed as td

    events = []
    one = distributed.DistInfo(rank=0, world_size=2, local_rank=0)
    monkeypatch.setattr(td, "is_initialized", lambda: True)
    monkeypatch.setattr(td, "barrier", lambda: events.append("barrier"))
    monkeypatch.setattr(td, "destroy_process_group", lambda: events.append("destroy"))
    monkeypatch.setattr(td.distributed_c10d, "_abort_process_group", lambda: events.append("abort"))
    monkeypatch.setattr(distributed, "_device_backends", lambda td: {"cpu", "cuda"})
    distributed.shutdown(one, wait_for_peers=False)
    assert events == ["abort"]
    events.clear()
    distributed.shutdown(one, wait_for_peers=True)
    assert events == ["barrier", "destroy"]
    events.clear()
    monkeypatch.setattr(distributed, "_device_backends", lambda td: {"cpu"})
    distributed.shutdown(one, wait_for_peers=False)
    assert events == ["destroy"]
