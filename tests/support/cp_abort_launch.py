"""A context-parallel `sagegen run` whose rank 0 fails mid-run, as a full disk would: its first sample's write
raises while rank 1 has gone on to the next sample's first collective.

`distributed.shutdown` must then end the run instead of hanging: under NCCL it aborts the communicators
(destroying the group would wait for rank 1 forever), rank 0 exits with its error and torchrun ends rank 1.
`launch` runs it under torchrun with 2 processes (gloo on the CPU, NCCL on 2 GPUs); this file is also the
script torchrun starts. It runs an image model: its PNG samples need no ffmpeg, which a GPU host may lack.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

INJECTED = "No space left on device (injected by cp_abort_launch)"


def launch(tmp_path: Path, *, cuda: bool, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    """Run the failing job; returns the finished process and its wall time (raises TimeoutExpired on a hang)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), SAGEGEN_RUNS=str(tmp_path / "runs"),
               OMP_NUM_THREADS="1", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("SAGEGEN_DEBUG", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
           str(tmp_path / "run")]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def main(out: str) -> None:
    from sagegen.runs import directory as rundir

    if int(os.environ.get("RANK", "0")) == 0:
        def fail(*args, **kwargs):
            raise OSError(28, INJECTED)

        rundir.RunDir.write_sample = fail
    from sagegen.cli.app import main as cli_main

    sys.argv = ["sagegen", "run", "tiny-flux", "--cp", "ulysses=2", "-p", "a red fox in the snow",
                "-p", "a boat on a lake", "--steps", "2", "--warmup", "0", "--out", out]
    cli_main()


if __name__ == "__main__":
    main(sys.argv[1])
