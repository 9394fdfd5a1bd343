"""Shared test utilities: error metrics, random attention problems, a graph-recording compile backend."""

from __future__ import annotations

import torch


def rel_l1(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().sum() / ref.abs().sum()).item()


def cosine(x: torch.Tensor, ref: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(x.double().flatten(), ref.double().flatten(), dim=0).item()


def qkv(b, hq, hkv, nq, nk, d, dtype=torch.float16, layout="HND", device="cpu", contiguous=True):
    """Random N(0,1) q, k, v in the given layout; non-contiguous views when contiguous=False."""

    def make(h, n):
        if contiguous:
            shape = (b, h, n, d) if layout == "HND" else (b, n, h, d)
            return torch.randn(shape, device=device).to(dtype)
        # A strided view: the other layout's storage, transposed, plus a sliced-off head-dim pad.
        shape = (b, n, h, d + 8) if layout == "HND" else (b, h, n, d + 8)
        return torch.randn(shape, device=device).to(dtype).transpose(1, 2)[..., :d]

    return make(hq, nq), make(hkv, nk), make(hkv, nk)


def to_hnd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "HND" else t.transpose(1, 2)


def graph_recorder():
    """(graphs, backend): a torch.compile backend that runs each FX graph as traced and keeps it in ``graphs``."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return graphs, backend
