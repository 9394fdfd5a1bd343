"""Does a context-parallel run end, instead of hanging, when rank 0 fails while its peer is still working?

Launched with torchrun on 2 GPUs (NCCL for CUDA tensors): rank 0's first `RunDir.write_sample` raises, as a full
disk would, while rank 1 has already gone on to the next sample's first collective. `distributed.shutdown`
must abort the NCCL communicators (destroying the group would wait for rank 1 forever), rank 0 must exit with
its error, and torchrun must end rank 1. The caller times the whole launch and checks its exit status:

    timeout 300 torchrun --nproc-per-node 2 bench/probes/probe_cp_abort.py --out DIR; echo "exit $?"

Anything but a prompt nonzero exit (124 from `timeout` is the hang this guards against) is a failure.
"""

from __future__ import annotations

import os
import sys

from sagegen import rundir


def main() -> None:
    out = sys.argv[sys.argv.index("--out") + 1]
    if int(os.environ.get("RANK", "0")) == 0:
        def fail(*args, **kwargs):
            raise OSError(28, "No space left on device (injected by probe_cp_abort)")

        rundir.RunDir.write_sample = fail
    from sagegen.cli.app import main as cli_main

    sys.argv = ["sagegen", "run", "tiny-wan2.1", "--cp", "ulysses=2", "-p", "a red fox in the snow",
                "-p", "a boat on a lake", "--out", out]
    cli_main()


if __name__ == "__main__":
    main()
