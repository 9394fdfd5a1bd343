"""The training-free block-mask predictor (in the spirit of SpargeAttn; written from its paper's idea).

For one attention call, per (batch, head, q-block):
1. pooled Q and K per block (their means) and each block's self-similarity (`pool`);
2. estimated block weights: softmax over key blocks of (mean(Q_i) · mean(K_j) · scale + log n_j), n_j the
   live keys of block j -- what the block would weigh if its tokens all equalled their mean;
3. kept key blocks: top-k (a fraction of the key blocks) or the fewest whose estimated weight reaches a
   cumulative mass ("cdf");
4. always kept: query blocks whose tokens disagree (self-similarity below the judge's threshold) are
   computed densely, key blocks whose tokens disagree are kept for every query; text/condition tokens (keys
   kept for everyone, their queries dense); the first key block (an attention sink); each query block's own
   key block in self-attention; key blocks with no live key (key-padding mask) are dropped.

Everything is tensor ops on the inputs' device with shapes known from the inputs: no host syncs, so it runs
inside `sagegen.sageattn`'s custom op and `torch.compile(fullgraph=True)` traces the call.
"""

from __future__ import annotations

import math

import torch

from sagegen.sparse import pool as _pool
from sagegen.sparse.block_masks import BlockSparse, from_keep
from sagegen.sparse.sparse_config import SparseConfig


def block_range(start: int, stop: int, n: int, block: int, device, offset: int = 0,
                total: int | None = None) -> torch.Tensor:
    """bool [NB]: the blocks of `block` tokens (out of n) that hold any token of [start, stop) (negative =
    from the end). ``offset`` / ``total``: the n tokens are positions [offset, offset + n) of a sequence of
    ``total`` tokens (a query window: one rank's queries under Ring), which start and stop refer to."""
    total = n if total is None else total
    nb = -(-n // block)
    start, stop = (s + total if s < 0 else s for s in (start, stop))
    start, stop = max(0, min(total, start)), max(0, min(total, stop))
    first = offset + torch.arange(nb, device=device) * block
    last = torch.clamp(first + block, max=offset + n)
    return (first < stop) & (last > start) & (stop > start)


def diagonal(nqb: int, nkb: int, block_q: int, block_kv: int, device, q_offset: int = 0) -> torch.Tensor:
    """bool [NQB, NKB]: the key blocks that overlap each query block's own tokens (query i covers positions
    q_offset + [i·block_q, (i+1)·block_q) of the key sequence)."""
    qi = q_offset + torch.arange(nqb, device=device)[:, None] * block_q
    kj = torch.arange(nkb, device=device)[None, :] * block_kv
    return (kj < qi + block_q) & (kj + block_kv > qi)


def live_key_counts(n_k: int, block_kv: int, key_bias: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    """fp32 [B, NKB]: keys per key block that a key-padding bias [B, Nk] (-inf = masked) keeps."""
    nkb = -(-n_k // block_kv)
    live = torch.ones(batch, n_k, device=device) if key_bias is None else (key_bias > -math.inf).float()
    live = torch.nn.functional.pad(live, (0, nkb * block_kv - n_k))
    return live.view(live.shape[0], nkb, block_kv).sum(-1).expand(batch, nkb)


def block_scores(q_mean: torch.Tensor, k_mean: torch.Tensor, sm_scale: float, live: torch.Tensor) -> torch.Tensor:
    """Estimated block weights [B, Hq, NQB, NKB] (rows sum to 1) from pooled means (k_mean [B, Hkv, ...])."""
    group = q_mean.shape[1] // k_mean.shape[1]
    if group > 1:
        k_mean = k_mean.repeat_interleave(group, dim=1)
    s = (q_mean @ k_mean.transpose(-1, -2)) * sm_scale
    s = s + torch.log(live)[:, None, None, :]  # log 0 = -inf: a block of masked keys gets no weight
    return torch.softmax(s, dim=-1).nan_to_num_(0.0)  # every key masked: a zero row


def select(p: torch.Tensor, mode: str, value: float) -> torch.Tensor:
    """bool [.., NKB]: the key blocks kept by top-k (fraction `value`) or by cumulative mass `value`."""
    nkb = p.shape[-1]
    if mode == "topk":
        k = max(1, min(nkb, math.ceil(value * nkb - 1e-9)))
        idx = torch.topk(p, k, dim=-1).indices
        return torch.zeros_like(p, dtype=torch.bool).scatter_(-1, idx, True)
    sorted_p, order = torch.sort(p, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the blocks ranked above
    keep_sorted = before < value
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


def predict_keep(q: torch.Tensor, k: torch.Tensor, cfg: SparseConfig, *, sm_scale: float, block_q: int,
                 block_kv: int, key_bias: torch.Tensor | None = None, value: float | None = None,
                 stats=None, q_offset: int | None = None) -> torch.Tensor:
    """bool keep [B, Hq, NQB, NKB] for q [B, Hq, Nq, D], k [B, Hkv, Nk, D] (see the module doc).

    stats: precomputed ((q_mean, q_sim), (k_mean, k_sim)) from `pool.pool_blocks`, else computed here.
    q_offset: the queries are positions [q_offset, q_offset + Nq) of a self-attention over the Nk keys (one
    rank's queries under Ring): the text rows and the diagonal follow those positions. None: an ordinary
    call (self-attention when Nq == Nk)."""
    B, Hq, Nq, _ = q.shape
    Nk = k.shape[2]
    dev = q.device
    if stats is None:
        stats = (_pool.pool_blocks(q, block_q), _pool.pool_blocks(k, block_kv))
    (q_mean, q_sim), (k_mean, k_sim) = stats
    live = live_key_counts(Nk, block_kv, key_bias, B, dev)
    p = block_scores(q_mean, k_mean, sm_scale, live)
    keep = select(p, cfg.mode, cfg.value if value is None else value)
    keep = keep | always_keep(cfg, q_sim, k_sim, Hq, Nq, Nk, block_q, block_kv, dev, q_offset)
    return keep & (live > 0)[:, None, None, :]


def predict_compact(q: torch.Tensor, k: torch.Tensor, cfg: SparseConfig, *, sm_scale: float, block_q: int,
                    block_kv: int, key_bias: torch.Tensor | None = None,
                    q_offset: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`predict_keep` + `BlockSparse.from_block_dense` with the selection, rules and compaction in one Triton
    pass (`kernels.triton_block_select`): (counts [B, Hq, NQB], indices [B, Hq, NQB, NKB]) int32. For CUDA
    tensors or under the Triton interpreter; the same blocks as the PyTorch path up to exact score ties."""
    from sagegen.kernels.triton_block_select import select_blocks

    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    (q_mean, q_sim), (k_mean, k_sim) = _pool.pool_blocks(q, block_q), _pool.pool_blocks(k, block_kv)
    group = Hq // Hkv
    nqb, nkb = q_mean.shape[2], k_mean.shape[2]
    # [B, Hkv, group*NQB, D] @ [B, Hkv, D, NKB]: no repeat of K's means for GQA
    scores = (q_mean.reshape(B, Hkv, group * nqb, D) @ k_mean.transpose(-1, -2)).view(B, Hq, nqb, nkb)
    if key_bias is None:  # every key live: the counts depend on the shape only (cached with the rules)
        live = _cached(("live", Nk, block_kv, str(q.device)),
                       lambda: live_key_counts(Nk, block_kv, None, 1, q.device).contiguous())
    else:
        live = live_key_counts(Nk, block_kv, key_bias, B, q.device)
    rows, cols = _rule_vectors(cfg, Nq, Nk, block_q, block_kv, q.device, q_offset)
    return select_blocks(scores, live, mode=cfg.mode, value=cfg.value, scale=sm_scale, rows_always=rows,
                         cols_always=cols, keep_diagonal=cfg.keep_diagonal and is_self_attention(Nq, Nk, q_offset),
                         block_q=block_q, block_kv=block_kv, q_sim=q_sim, k_sim=k_sim,
                         sim_threshold=cfg.sim_threshold, q_offset=q_offset or 0)


def is_self_attention(n_q: int, n_k: int, q_offset: int | None) -> bool:
    """Whether the diagonal rule applies: Nq == Nk, or a query window of the keys' sequence."""
    return n_q == n_k if q_offset is None else True


_RULES: dict = {}


def _rule_vectors(cfg: SparseConfig, n_q: int, n_k: int, block_q: int, block_kv: int, device,
                  q_offset: int | None = None):
    """(rows int8 [NQB], cols int8 [NKB]): the text and first-block rules, built once per shape and device
    (static, so cached: rebuilding them cost half a dozen launches per call)."""
    return _cached((cfg.text, cfg.keep_first, n_q, n_k, block_q, block_kv, str(device), q_offset),
                   lambda: _build_rules(cfg, n_q, n_k, block_q, block_kv, device, q_offset))


def _cached(key, build):
    hit = _RULES.get(key)
    if hit is None:
        if len(_RULES) > 64:
            _RULES.clear()
        hit = _RULES[key] = build()
    return hit


def _build_rules(cfg: SparseConfig, n_q: int, n_k: int, block_q: int, block_kv: int, device, q_offset=None):
    rows, cols = _rule_rows_cols(cfg, n_q, n_k, block_q, block_kv, device, q_offset)
    return rows.to(torch.int8), cols.to(torch.int8)


def _rule_rows_cols(cfg: SparseConfig, n_q: int, n_k: int, block_q: int, block_kv: int, device,
                    q_offset: int | None = None):
    """(rows bool [NQB], cols bool [NKB]): query blocks computed densely and key blocks kept for every query
    (text tokens, the first key block). With ``q_offset`` the query blocks are a window of the key sequence."""
    nkb = -(-n_k // block_kv)
    rows = torch.zeros(-(-n_q // block_q), dtype=torch.bool, device=device)
    cols = torch.zeros(nkb, dtype=torch.bool, device=device)
    if cfg.text is not None:
        if q_offset is None:
            rows = rows | block_range(*cfg.text, n_q, block_q, device)
        else:
            rows = rows | block_range(*cfg.text, n_q, block_q, device, offset=q_offset, total=n_k)
        cols = cols | block_range(*cfg.text, n_k, block_kv, device)
    if cfg.keep_first:
        cols = cols | (torch.arange(nkb, device=device) == 0)
    return rows, cols


def always_keep(cfg: SparseConfig, q_sim, k_sim, hq: int, n_q: int, n_k: int, block_q: int, block_kv: int,
                device, q_offset: int | None = None) -> torch.Tensor:
    """bool, broadcastable to [B, Hq, NQB, NKB]: the always-keep rules (judge, text, first, diagonal)."""
    nqb, nkb = -(-n_q // block_q), -(-n_k // block_kv)
    rows, cols = _rule_rows_cols(cfg, n_q, n_k, block_q, block_kv, device, q_offset)
    keep = rows[:, None] | cols[None, :]
    if cfg.keep_diagonal and is_self_attention(n_q, n_k, q_offset):
        keep = keep | diagonal(nqb, nkb, block_q, block_kv, device, q_offset or 0)
    if cfg.sim_threshold > 0:
        group = hq // k_sim.shape[1]
        ks = k_sim.repeat_interleave(group, dim=1) if group > 1 else k_sim
        keep = keep | (q_sim < cfg.sim_threshold)[..., None] | (ks < cfg.sim_threshold)[:, :, None, :]
    return keep


def predict(q: torch.Tensor, k: torch.Tensor, cfg: SparseConfig, *, sm_scale: float, block_q: int,
            block_kv: int, key_bias: torch.Tensor | None = None, value: float | None = None,
            q_offset: int | None = None) -> BlockSparse:
    """The predicted `BlockSparse` of one call (q, k in [B, H, N, D])."""
    keep = predict_keep(q, k, cfg, sm_scale=sm_scale, block_q=block_q, block_kv=block_kv, key_bias=key_bias,
                        value=value, q_offset=q_offset)
    return from_keep(keep, block_q, block_kv)
