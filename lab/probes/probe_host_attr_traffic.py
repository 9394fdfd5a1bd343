"""Host-side Python traffic of one patched forward, counted (not timed), by the line that caused it.

Eager image steps with FP8 linears wait on the host CPU (lab/NOTES.md v7.7): every `nn.Module.__getattr__`
(a buffer, parameter or submodule read), `nn.Module.__setattr__`, `os.environ` read and `Signature.bind` costs
0.2-6 us there. Counts are the same on a CPU and a GPU host for the same code path, so this runs on the CPU
(the tiny random-weight models, FP8 linears in emulation, `min_rows=1` so that every layer takes the FP8 path).

    TRITON_INTERPRET=1 python lab/probes/probe_host_attr_traffic.py --family flux [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import sys

import torch

import sagegen
from sagegen.linear import LinearPolicy
from sagegen.models.arch import example_inputs
from sagegen.models.tiny import build_tiny_transformer

_ROOT = os.path.dirname(os.path.dirname(sagegen.__file__))


def _caller(depth: int = 2) -> str:
    """The first frame outside torch's and os's own code: the line that asked."""
    f = sys._getframe(depth)
    while f is not None and ("/torch/" in f.f_code.co_filename or f.f_code.co_filename.startswith("<frozen")
                             or f.f_code.co_filename.endswith("os.py")):
        f = f.f_back
    if f is None:
        return "?"
    name = os.path.relpath(f.f_code.co_filename, _ROOT) if f.f_code.co_filename.startswith(_ROOT) else \
        os.path.basename(f.f_code.co_filename)
    return f"{name}:{f.f_lineno} ({f.f_code.co_name})"


class Counting:
    """Counts `nn.Module.__getattr__`, `nn.Module.__setattr__`, `os.environ` reads and `Signature.bind` calls
    by caller while active."""

    def __init__(self):
        self.counts = {k: collections.Counter() for k in ("getattr", "setattr", "environ", "bind")}
        self._saved = []

    def _wrap(self, owner, name, kind):
        original = getattr(owner, name)
        counter = self.counts[kind]

        def wrapper(*args, **kwargs):
            counter[_caller()] += 1
            return original(*args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def __enter__(self):
        self._wrap(torch.nn.Module, "__getattr__", "getattr")
        self._wrap(torch.nn.Module, "__setattr__", "setattr")
        self._wrap(type(os.environ), "__getitem__", "environ")
        self._wrap(inspect.Signature, "bind", "bind")
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="flux", help="a tiny family: flux, sd3, wan, cogvideox, ...")
    ap.add_argument("--linear", default="fp8", choices=["fp8", "none"])
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build_tiny_transformer(args.family, dtype=torch.bfloat16)
    inputs = example_inputs(model, batch=1, height=32, width=32, frames=5, text_tokens=7, dtype=torch.bfloat16,
                            device="cpu", seed=0)
    kw = dict(linear="fp8", linear_policy=LinearPolicy(min_rows=1, keep_blocks=())) if args.linear == "fp8" else {}
    with torch.no_grad(), sagegen.patched(model, backend="triton", **kw):
        model(**inputs)  # first call: calibration, caches
        with Counting() as c:
            model(**inputs)
    for kind, counter in c.counts.items():
        print(f"== {kind}: {sum(counter.values())} calls")
        for where, n in counter.most_common(args.top):
            print(f"{n:7d}  {where}")


if __name__ == "__main__":
    main()
