"""`sagegen calibrate`: per layer, the sparsest threshold whose attention error stays under a target.

One dense generation on the user's own prompts and weights: every attention call that the sparse policy
would run sparse (past the dense steps, outside the dense blocks, self-attention over enough tokens) is
answered with the dense sagegen output -- so the trajectory is the dense one -- and, on the side, computed
sparse at each candidate threshold with the predictor. Per layer and candidate the worst relative L2 error
(sparse vs dense, same numerics) and the realized density are kept; each layer gets the sparsest candidate
whose worst error is under the target (or the densest candidate if none is). Cost: (1 + candidates) times the
attention of one generation -- minutes, not the days of a learned or searched mask. Per-head thresholds are
not searched (the per-layer result is what `run` / `compare` take).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from sagegen.sparse.sparse_config import SparseConfig

DEFAULT_CANDIDATES = {"cdf": (0.8, 0.9, 0.95, 0.98, 0.995), "topk": (0.1, 0.2, 0.3, 0.5, 0.7)}


def calibrate(pipe, generate: Callable[[], object], *, target: float = 0.05, base: SparseConfig | None = None,
              candidates: tuple[float, ...] | None = None, backend: str = "auto", config=None) -> dict:
    """Calibrate ``pipe`` (a diffusers pipeline or transformer; patched here, unpatched after) by running
    ``generate()`` (one or more generations on the user's prompts). Returns {"config": SparseConfig with
    layer_values, "layers": {name: {"value", "error", "density", "calls", "table"}}, "seconds", ...}."""
    import sagegen
    from sagegen.patch import patcher as patch_api
    from sagegen.sparse.op import sparse_block_mask

    base = base or SparseConfig(mode="cdf", value=0.95)
    if base.mode not in DEFAULT_CANDIDATES:
        raise ValueError(f"calibrate searches predicted masks (mode 'cdf' or 'topk'), got mode={base.mode!r}")
    cands = tuple(sorted(candidates or DEFAULT_CANDIDATES[base.mode]))
    if not cands or not all(0 < c <= 1 for c in cands):
        raise ValueError(f"candidates must be numbers in (0, 1], got {cands!r}")
    if not (isinstance(target, (int, float)) and target > 0):
        raise ValueError(f"target must be a positive number (relative L2 error), got {target!r}")

    sagegen.patch(pipe, config, backend=backend, sparse=base.replace(layer_values={}))
    session = next(iter(patch_api._states(pipe).values())).session  # the first denoiser's patch
    state = session.sparse
    stats: dict[str, dict[float, list]] = {}

    def observe(q, k, v, attn_mask, is_causal, scale):
        dense = sagegen.sageattn(q, k, v, attn_mask=attn_mask, is_causal=is_causal, sm_scale=scale,
                                 config=session.config, backend=backend)
        cfg = state.for_call(session.current_name, q, k)
        if cfg is None:
            return dense
        sm_scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        norm = dense.float().norm()
        table = stats.setdefault(session.current_name, {c: [] for c in cands})
        for c in cands:
            bs = sparse_block_mask(q, k, cfg.replace(value=c), tensor_layout="HND", attn_mask=attn_mask,
                                   sm_scale=sm_scale, config=session.config)
            out = sagegen.sageattn(q, k, v, attn_mask=attn_mask, is_causal=is_causal, sm_scale=scale,
                                   config=session.config, backend=backend, block_mask=bs)
            err = (out.float() - dense.float()).norm() / norm.clamp_min(1e-30)
            table[c].append(torch.stack([err, bs.counts.float().mean() / bs.indices.shape[-1]]))
        return dense

    patch_api.set_attention_override(pipe, observe)
    t0 = time.perf_counter()
    try:
        generate()
    finally:
        sagegen.unpatch(pipe)
    return _choose(base, cands, stats, target, time.perf_counter() - t0)


def _choose(base: SparseConfig, cands, stats, target: float, seconds: float) -> dict:
    layers, values = {}, {}
    for name, table in stats.items():
        rows = {c: torch.stack(v).tolist() for c, v in table.items() if v}  # one host sync per layer
        summary = {c: (max(r[0] for r in rs), sum(r[1] for r in rs) / len(rs), len(rs)) for c, rs in rows.items()}
        ok = [c for c in cands if c in summary and summary[c][0] <= target]
        # sparsest = lowest value for both modes (fewer blocks for top-k, less mass for cdf)
        pick = min(ok) if ok else max(summary)
        values[name] = pick
        layers[name] = {"value": pick, "error": round(summary[pick][0], 5), "density": round(summary[pick][1], 4),
                        "calls": summary[pick][2], "meets_target": bool(ok),
                        "table": {str(c): {"error": round(e, 5), "density": round(d, 4)}
                                  for c, (e, d, _) in summary.items()}}
    default = max(values.values()) if values else base.value
    cfg = base.replace(value=default, layer_values=values)
    return {"config": cfg, "layers": layers, "target": target, "candidates": list(cands),
            "seconds": round(seconds, 2)}
