"""The block mask of a `sageattn(..., sparse=...)` call, as its own `torch.library` custom op.

``sagegen::sparse_blocks`` takes the call's q, k (either layout), mask and the `SparseConfig` as its spec
string, and returns the `BlockSparse` tensors (counts, indices). `sagegen.sageattn` runs it right before
``sagegen::sageattn``: two opaque ops in one graph, so ``torch.compile(fullgraph=True)`` traces the call and
nothing syncs with the host. Block sizes are the kernel's tiles on the call's device (`SageConfig.blocks`),
decided outside the op so the fake (meta) implementation knows the output shapes.
"""

from __future__ import annotations

import math

import torch

from sagegen.config import SageConfig
from sagegen.kernels.block_sparse import BlockSparse
from sagegen.kernels.spec import device_capability
from sagegen.kernels.triton_quant import interpreting
from sagegen.sparse import patterns, predictor
from sagegen.sparse.sparse_config import STATIC, SparseConfig, parse_spec


def sparse_block_mask(q: torch.Tensor, k: torch.Tensor, sparse: SparseConfig | str, *, tensor_layout: str,
                      attn_mask: torch.Tensor | None, sm_scale: float, config: SageConfig,
                      q_offset: int | None = None) -> BlockSparse:
    """The BlockSparse for one call (validated inputs). ``sparse``: a SparseConfig or its `to_spec` string.
    ``q_offset``: the queries are positions [q_offset, q_offset + Nq) of a self-attention over the Nk keys
    (one rank's queries under Ring: the text rows, the diagonal and static windows follow those positions)."""
    n_dim = 2 if tensor_layout == "HND" else 1
    if q_offset is not None and not (0 <= q_offset and q_offset + q.shape[n_dim] <= k.shape[n_dim]):
        raise ValueError(f"q_offset must be None or an int with 0 <= q_offset and q_offset + Nq <= Nk (the "
                         f"queries a window of the keys' sequence), got {q_offset} for Nq = {q.shape[n_dim]}, "
                         f"Nk = {k.shape[n_dim]}")
    spec = sparse if isinstance(sparse, str) else sparse.to_spec()
    hnd = tensor_layout == "HND"
    cap = device_capability(q.device) if q.is_cuda else None
    block_q, block_kv = config.blocks(q.shape[-1], cap)
    counts, indices = torch.ops.sagegen.sparse_blocks(q, k, attn_mask, float(sm_scale), hnd, spec, block_q,
                                                      block_kv, -1 if q_offset is None else int(q_offset))
    return BlockSparse(counts, indices, block_q, block_kv)


def _key_bias(attn_mask: torch.Tensor | None, batch: int, n_k: int) -> torch.Tensor | None:
    """A key-padding mask (the same for every head and query row) as an fp32 bias [B, Nk]; else None (other
    masks are left to the kernel: the predictor only ranks blocks)."""
    if attn_mask is None:
        return None
    m = attn_mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    const = lambda d: m.shape[d] == 1 or m.stride(d) == 0
    if not (const(1) and const(2)):
        return None
    row = m[:, 0, 0, :].expand(m.shape[0], n_k)
    bias = (torch.zeros(row.shape, device=row.device).masked_fill(~row, -math.inf) if row.dtype == torch.bool
            else row.float())
    return bias.expand(batch, n_k)


@torch.library.custom_op("sagegen::sparse_blocks", mutates_args=())
def _sparse_blocks_op(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, sm_scale: float,
                      hnd: bool, spec: str, block_q: int, block_kv: int,
                      q_offset: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = parse_spec(spec)
    qh, kh = (q, k) if hnd else (q.transpose(1, 2), k.transpose(1, 2))
    window = None if q_offset < 0 else q_offset
    if cfg.mode in STATIC:
        keep = patterns.static_keep(cfg, qh.shape[2], kh.shape[2], block_q, block_kv, q.device, window)
    elif q.is_cuda or interpreting():  # one selection pass instead of ~25 small kernels
        return predictor.predict_compact(qh, kh, cfg, sm_scale=sm_scale, block_q=block_q, block_kv=block_kv,
                                         key_bias=_key_bias(attn_mask, qh.shape[0], kh.shape[2]), q_offset=window)
    else:
        keep = predictor.predict_keep(qh, kh, cfg, sm_scale=sm_scale, block_q=block_q, block_kv=block_kv,
                                      key_bias=_key_bias(attn_mask, qh.shape[0], kh.shape[2]), q_offset=window)
    bs = BlockSparse.from_block_dense(keep, block_q, block_kv)
    return bs.counts, bs.indices


@_sparse_blocks_op.register_fake
def _(q, k, attn_mask, sm_scale, hnd, spec, block_q, block_kv, q_offset=-1):
    b, h, n_q = (q.shape[0], q.shape[1], q.shape[2]) if hnd else (q.shape[0], q.shape[2], q.shape[1])
    n_k = k.shape[2] if hnd else k.shape[1]
    if parse_spec(spec).mode in STATIC:
        b = h = 1
    nqb, nkb = -(-n_q // block_q), -(-n_k // block_kv)
    return (q.new_empty((b, h, nqb), dtype=torch.int32), q.new_empty((b, h, nqb, nkb), dtype=torch.int32))
