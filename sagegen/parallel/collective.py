"""sagegen's context-parallel attention: Ulysses, Ring and both (USP), on diffusers' process groups.

Called by sagegen's diffusers attention backend when diffusers hands it a ``_parallel_config``; the local
attention (sagegen on local tensors) is passed in, so this module knows nothing of kernels or models.

Differences from diffusers' templates (see masks.py and `_RingMerge`): the key mask follows the rotated KV
chunk, per-head masks are sliced to the Ulysses heads, the Ring merge of a fully masked chunk is exact
(never NaN), and USP (both degrees > 1) handles masks at all.
"""

from __future__ import annotations

from typing import Callable

import torch

from sagegen.parallel.masks import prepare_mask, ring_key_slice
from sagegen.parallel.topology import Topology, all_gather, heads_to_seq, segment_order, seq_to_heads, topology_from

# local_attention(q, k, v, *, attn_mask, scale, return_lse) on [B, S, H, D] tensors (called with keywords; a
# Ring's one call adds q_offset, q's first position in k's sequence, and a call per part adds call_rows, the
# rows of the call it is part of, so that a router picks the route one process would); with return_lse it returns
# (out [B, S, H, D], lse [B, S, H] fp32, natural log, -inf for rows with every key masked).
LocalAttention = Callable[..., object]


def context_parallel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    scale: float | None,
    return_lse: bool,
    parallel_config,
    local_attention: LocalAttention,
    is_causal: bool = False,
    enable_gqa: bool = False,
    segments: tuple[int, ...] | None = None,
    ring_one_call: bool = False,
    ring_in_order: bool = False,
    ring_part_calls: bool = True,
):
    """Attention over the whole CP group's sequence for this rank's local queries.

    Args:
        query, key, value: this rank's chunks, [B, S_local, H, D] (diffusers' layout).
        attn_mask: bool (True = attend) or additive mask broadcastable to [B, H, S_q, S_kv], built on either
            the local or the global sequence (see `masks.prepare_mask`), or [B, S_kv]; None for no mask.
        scale: softmax scale (None: 1/sqrt(D)).
        return_lse: also return the natural-log LSE [B, S_local, H] fp32.
        parallel_config: diffusers' ParallelConfig (or ContextParallelConfig) after ``enable_parallelism``.
        local_attention: ``f(q, k, v, *, attn_mask, scale, return_lse)`` on local [B, S, H, D] tensors.
        is_causal, enable_gqa: not supported under CP (a ValueError).
        segments: lengths that split every rank's sequence into parts (a joint call's (video, text), or
            (text, image)): under Ulysses the local attention then sees each part of every rank together,
            which is one process's order ([all video, all text]): the same blocks, key-padding masks that stay
            a valid prefix, and block-sparse rules that hold as on one GPU. Under Ring only with
            ``ring_in_order`` (else the ring, and a Ulysses step under it, keep chunk order).
        ring_one_call: under Ring, gather the ring's keys and values whole and attend once, calling
            ``local_attention(..., q_offset=...)`` with this rank's queries' first position in that key sequence
            (a block-sparse predictor ranks each query's blocks over every key and places its rules by position),
            instead of a call per KV chunk merged by the LSE. sagegen's diffusers backend does (faster, less
            memory, and one GPU's quantization of the keys); False keeps the chunk-by-chunk ring.
        ring_in_order: with ``ring_one_call`` and ``segments``: the gathered keys are put in one process's order
            ([all video, all text]), where one GPU has them (sagegen's backend does for joint calls).
        ring_part_calls: with ``ring_in_order``: each segment's queries attend in a call of their own, at their
            own ``q_offset`` (and with ``call_rows``), which a block-sparse policy needs to place its rules;
            False: one call over this rank's rows (a dense call: the same output, one launch).
    Returns:
        out [B, S_local, H, D] in query's dtype, or (out, lse).
    """
    topo = topology_from(parallel_config)
    _validate(query, key, value, is_causal, enable_gqa, topo)
    b, sq, h, _ = query.shape
    if segments is not None:
        segments = tuple(int(n) for n in segments)
        if any(n < 0 for n in segments) or sum(segments) != sq or key.shape[1] != sq:
            raise ValueError(f"segments {segments} must be lengths >= 0 that add up to the local sequence ({sq} "
                             f"queries, {key.shape[1]} keys)")
        in_order = topo.ring > 1 and ring_one_call and ring_in_order
        if not (in_order or (topo.ring == 1 and topo.ulysses > 1)):
            segments = None
    mask = prepare_mask(attn_mask, batch=b, heads=h, sq_local=sq, skv_local=key.shape[1], topo=topo,
                        segments=segments)
    if topo.ulysses > 1:
        query, key, value = (seq_to_heads(x, topo, segments) for x in (query, key, value))
    if topo.ring > 1 and ring_one_call:
        # with segments: a ring rank's parts, after the Ulysses step
        ring_segments = tuple(topo.ulysses * n for n in segments) if segments is not None else None
        out, lse = _ring_one_call(query, key, value, mask, scale, return_lse, topo, local_attention, ring_segments,
                                  ring_part_calls)
    elif topo.ring > 1:
        out, lse = _ring(query, key, value, mask, scale, topo, local_attention)
    else:
        res = local_attention(query, key, value, attn_mask=mask, scale=scale, return_lse=return_lse)
        out, lse = res if return_lse else (res, None)
    if topo.ulysses > 1:
        out = heads_to_seq(out, topo, segments)
        lse = heads_to_seq(lse, topo, segments) if return_lse else None
    return (out, lse) if return_lse else out


def _validate(q, k, v, is_causal, enable_gqa, topo: Topology) -> None:
    if is_causal:
        raise ValueError("is_causal=True is not supported under context parallelism (sagegen, like diffusers, "
                         "splits the sequence without a causal schedule); pass an explicit attn_mask instead")
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be [B, S_local, H, D] under context parallelism, got {tuple(t.shape)}")
    if enable_gqa or k.shape[2] != q.shape[2]:
        raise ValueError(f"grouped-query attention (query heads {q.shape[2]}, key heads {k.shape[2]}) is not "
                         "supported under context parallelism; repeat the key/value heads first")
    if k.shape != v.shape:
        raise ValueError(f"key and value must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if topo.ulysses > 1 and q.shape[2] % topo.ulysses:
        raise ValueError(f"Ulysses needs the number of heads ({q.shape[2]}) to be a multiple of ulysses_degree "
                         f"({topo.ulysses}); pick a degree that divides {q.shape[2]} or use ring_degree")


def _ring(q, k, v, mask, scale, topo: Topology, local_attention):
    """Ring over the ring group: each rank gathers every KV chunk once (diffusers' "allgather" rotation) and
    attends its queries to chunk (ring_rank + step) % R at each step, merging with the LSE in fp32."""
    r = topo.ring
    kv = all_gather(torch.cat([k.flatten(), v.flatten()]), 0, topo.ring_group).chunk(r)
    merge = _RingMerge()
    for step in range(r):
        chunk = (topo.ring_rank + step) % r
        if step == 0:
            kc, vc = k, v
        else:
            kc = kv[chunk][:k.numel()].view_as(k)
            vc = kv[chunk][k.numel():].view_as(v)
        out, lse = local_attention(q, kc, vc, attn_mask=ring_key_slice(mask, chunk, topo), scale=scale,
                                   return_lse=True)
        merge.add(out, lse)
    out, lse = merge.result()
    return out.to(q.dtype), lse


def _ring_one_call(q, k, v, mask, scale, return_lse, topo: Topology, local_attention, segments=None,
                   part_calls: bool = True):
    """Ring with the keys gathered whole (in chunk order, which is the sequence's order: see topology's doc):
    one local call of this rank's queries -- ring super-chunk ``ring_rank``, so positions ring_rank * S_q
    onwards -- over every key, with the prepared mask's every key column.

    ``segments`` (a joint call's parts, this ring rank's lengths): the gathered keys are put in one process's
    order (each part of every ring rank together, as `prepare_mask` orders the mask's key columns). With
    ``part_calls`` each part's queries attend in a call of their own, at ``q_offset`` = the part's start in that
    order plus ring_rank times its length, with ``call_rows`` = this rank's rows; else in one call."""
    r = topo.ring
    segments = segments or (q.shape[1],)
    k_all, v_all = all_gather(k, 1, topo.ring_group), all_gather(v, 1, topo.ring_group)
    if len(segments) > 1:
        order = segment_order(r, segments, k.device)
        k_all, v_all = k_all.index_select(1, order), v_all.index_select(1, order)
        if not part_calls:
            res = local_attention(q, k_all, v_all, attn_mask=mask, scale=scale, return_lse=return_lse)
            return res if return_lse else (res, None)
    parts = {"call_rows": q.shape[1]} if len(segments) > 1 else {}
    outs, lses = [], []
    start = first = 0  # the part's first row here, and its first position in the gathered keys
    for n in segments:
        if n:
            rows = slice(start, start + n)
            part_mask = mask if mask is None or mask.shape[2] == 1 else mask[:, :, rows]
            res = local_attention(q[:, rows], k_all, v_all, attn_mask=part_mask, scale=scale,
                                  return_lse=return_lse, q_offset=first + topo.ring_rank * n, **parts)
            out, lse = res if return_lse else (res, None)
            outs.append(out)
            lses.append(lse)
        start, first = start + n, first + r * n
    out = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
    if not return_lse:
        return out, None
    return out, (lses[0] if len(lses) == 1 else torch.cat(lses, 1))


class _RingMerge:
    """Online softmax merge of partial results (out_i, lse_i), in fp32 with natural-log LSEs.

    Keeps a running max m, sum l = sum exp(lse_i - m) and acc = sum exp(lse_i - m) * out_i. A chunk whose
    every key is masked has lse -inf and weight exactly 0 (its output, zeros or NaN, is not read); a row
    masked in every chunk ends as out 0, lse -inf, as single-process sagegen gives. diffusers' sigmoid
    merge computes (-inf) - (-inf) there and turns the row NaN (defect c)."""

    def __init__(self):
        self.m = self.l = self.acc = None

    def add(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        out, lse = out.float(), lse.float()
        if self.m is None:
            self.m = lse
            w = torch.isfinite(lse).float()                       # exp(lse - lse), 0 for -inf rows
            self.l = w
            self.acc = torch.where(w[..., None] > 0, out, 0.0)
            return
        m = torch.maximum(self.m, lse)
        m_safe = torch.where(torch.isfinite(m), m, 0.0)           # both -inf: any finite shift gives 0 weights
        alpha = torch.exp(self.m - m_safe)
        beta = torch.exp(lse - m_safe)
        self.acc = self.acc * alpha[..., None] + torch.where(beta[..., None] > 0, out * beta[..., None], 0.0)
        self.l = self.l * alpha + beta
        self.m = m

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        empty = self.l == 0
        out = self.acc / torch.where(empty, 1.0, self.l)[..., None]
        lse = torch.where(empty, float("-inf"), self.m + torch.log(torch.where(empty, 1.0, self.l)))
        return out, lse
