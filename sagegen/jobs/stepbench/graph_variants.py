"""`sagegen bench --cuda-graphs`: the eager variants with each forward replayed as a CUDA graph.

stock_graphs (the unpatched model under the same wrapper, so the comparison is fair to stock), sagegen_graphs
and, with --linear fp8, sagegen_fp8_graphs. Each gets one untimed call before the timer's warm-up: the first
call of a shape runs eagerly and the second captures, so the timed runs are replays.
"""

from __future__ import annotations

import sagegen
from sagegen.patch import graphs


def graph_variants(model, forward, record, args, config, backend) -> None:
    def timed(name):
        if args.only is None or name in args.only:
            forward(model)()  # eager warm-up; the timer's warm-up call captures
            entry = record(name, forward(model))
            info = graphs.info(model)
            if entry is not None and info is not None:  # captured or not, and why not
                entry["cuda_graphs"] = info
                print(f"  {name}: {info['graphs']} graph(s), calls {info['calls']}"
                      + (f", capture failed: {info['failed']}" if info["failed"] else ""), flush=True)

    graphs.enable(model)
    timed("stock_graphs")
    graphs.disable(model)
    sagegen.patch(model, config, backend=backend, cuda_graphs=True)
    timed("sagegen_graphs")
    if args.linear:
        sagegen.patch(model, config, backend=backend, linear=args.linear, linear_policy=args.linear_policy,
                      cuda_graphs=True)
        timed("sagegen_fp8_graphs")
    sagegen.unpatch(model)
