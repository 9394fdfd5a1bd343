"""Whether an SDPA call can go to `sagegen.sageattn`, and its square padding mask made per-key.

Shared by the two ways sagegen answers a model's attention call: diffusers' ``"sagegen"`` backend
(`sagegen.backend.attention`) and the patcher's processor wrapper (`sagegen.patch.wrapper`). Calls sagegen
cannot take run on SDPA unchanged; `unsupported` names the reason counted in ``patch_info(obj)["stats"]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sagegen.config import SUPPORTED_HEAD_DIMS

_HALF = (torch.float16, torch.bfloat16)
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def simplify_mask(mask, n_q: int):
    """A boolean [B, 1 or H, Nq, Nk] mask that is (valid query) x (valid key), the same for every head (the
    square text-padding mask of HunyuanVideo in diffusers 0.32, or any padding mask a processor expanded to
    Nq rows), becomes the key-padding mask [B, 1, 1, Nk], applied per key inside the kernel with no Nq x Nk
    reads, plus the [B, 1, Nq, 1] query rows that have no key (their output is zero). Anything else is
    returned unchanged."""
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or n_q == 1 or mask.shape[2] != n_q:
        return mask, None
    first = mask[:, :1]
    keys = first.any(dim=2, keepdim=True)
    rows = first.any(dim=3, keepdim=True)
    # Every row with a key must equal `keys` and every other row must be empty, in every head. Checked in
    # chunks of query rows, so a huge mask is never materialised a second time.
    step = max(1, (1 << 26) // max(1, mask.shape[0] * mask.shape[1] * mask.shape[3]))
    for i in range(0, n_q, step):
        if (mask[:, :, i:i + step] ^ (keys & rows[:, :, i:i + step])).any():
            return mask, None
    return keys, (None if bool(rows.all()) else rows)


def bind_sdpa(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
    bound.update(zip(SDPA_ARGS, args))
    bound.update(kwargs)
    return bound


def unsupported(b: dict[str, Any]) -> str | None:
    """Why this SDPA call cannot go to sageattn (it then runs on SDPA unchanged), or None."""
    q, k, v, mask = b.get("query"), b.get("key"), b.get("value"), b["attn_mask"]
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "args"
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        return "shape"
    if q.dtype not in _HALF + (torch.float32,) or not (q.dtype == k.dtype == v.dtype):
        return "dtype"
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS or q.shape[-1] != k.shape[-1]:
        return "head_dim"
    if q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
        return "shape"
    if q.shape[1] != k.shape[1] and not b["enable_gqa"]:
        return "shape"  # SDPA itself rejects this; let it raise its own error
    if b["dropout_p"] not in (0, 0.0):
        return "dropout"
    if mask is not None and (b["is_causal"] or not isinstance(mask, torch.Tensor)):
        return "mask"
    if b["scale"] is not None and not (isinstance(b["scale"], (int, float)) and math.isfinite(b["scale"])
                                       and b["scale"] > 0):
        return "scale"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return "grad"  # sageattn is inference-only
    if q.numel() == 0 or k.numel() == 0:
        return "empty"
    return None
