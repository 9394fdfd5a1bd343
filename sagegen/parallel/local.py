"""The local attention that sagegen's context parallelism runs on each rank: `sagegen.sageattn` on
[B, S, H, D] tensors, with the LSE in the layout diffusers' CP uses ([B, S, H], natural log, fp32)."""

from __future__ import annotations

import torch

from sagegen.api import sageattn
from sagegen.config import SageConfig


def sagegen_local_attention(config: SageConfig | None = None, backend: str = "auto"):
    """A ``local_attention(q, k, v, attn_mask, scale, return_lse)`` callable for
    `context_parallel_attention` that runs ``sagegen.sageattn`` (NHD layout) with ``config``."""

    def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask, scale, return_lse: bool,
                        q_offset: int | None = None, call_rows: int | None = None):
        # q_offset (a Ring's one call: where q sits in k's sequence) matters to block-sparse policies only
        res = sageattn(q, k, v, tensor_layout="NHD", attn_mask=attn_mask, sm_scale=scale,
                       return_lse=return_lse, config=config, backend=part_backend(backend, q, k, call_rows))
        if not return_lse:
            return res
        out, lse = res
        return out, lse.transpose(1, 2)      # sageattn's lse is [B, H, S] in either layout

    return local_attention


def part_backend(backend: str, q: torch.Tensor, k: torch.Tensor, call_rows: int | None) -> str:
    """`sageattn`'s backend for one part of a call attended part by part (a Ring's joint call in one process's
    order: `context_parallel_attention`'s ``call_rows``). ``"auto"`` decides on the whole call's rows, as for the
    call in one piece: a short part (a joint call's text rows) then runs the kernel with the rest rather than
    PyTorch SDPA, so the output stays one process's. q, k: [B, S, H, D]."""
    if call_rows is None or backend != "auto" or not q.is_cuda:
        return backend
    from sagegen.kernels.dispatch import auto_prefers_sdpa

    whole_to_sdpa = auto_prefers_sdpa(call_rows, k.shape[1], q.shape[0] * q.shape[2], q.shape[3])
    return backend if whole_to_sdpa else "triton"
