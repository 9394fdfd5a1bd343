"""Key-padding masks in the form the Gluon kernel runs: per-batch valid-key counts, the valid keys first.

The Gluon kernel takes a key-padding mask only as a valid prefix (it skips the padded key blocks). A mask whose
valid keys are not a prefix -- text padding in the middle of a joint sequence, as in HunyuanVideo's
[video, text] chunks gathered by Ulysses -- would otherwise run on the slower portable Triton kernel. Attention
does not depend on the order of the keys (K and V moved together), and masked keys take no part in the
smoothing means or the scales, so such a call first gathers each batch's valid keys to the front: one copy of
the valid part of K and V, against a kernel that reads K and V once per query block.
"""

from __future__ import annotations

import torch


def key_prefix_lengths(key_bias: torch.Tensor) -> torch.Tensor | None:
    """int32 [B] valid-key counts when a key-padding bias [B, Nk] is 0 on a prefix of the keys and -inf after
    it (text padded at the end, as HunyuanVideo's), with at least one valid key; else None. One host sync."""
    live = key_bias > float("-inf")
    n = live.sum(dim=1)
    prefix = live.int().cumprod(dim=1).sum(dim=1) == n
    ok = prefix.all() & (key_bias.masked_fill(~live, 0.0) == 0).all() & (n > 0).all()
    return n.to(torch.int32) if bool(ok) else None


def compact_valid_keys(k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor):
    """Each batch's valid keys moved to the front, in their order.

    Args:
        k, v: [B, Hkv, Nk, D], any strides.
        key_bias: fp32 [B or 1, Nk], 0 = attend, -inf = masked.
    Returns:
        (k, v, key_bias, lengths): k and v contiguous [B, Hkv, N, D] with N the largest valid count, key_bias
        [B, N] (0 on each batch's first lengths[b] keys, -inf after), lengths int32 [B]; or None when the bias
        holds finite values other than 0 (an additive mask, not padding) or a batch has no valid key (the
        Triton kernel gives those rows zeros). One host sync.
    """
    b, hkv, _, d = k.shape
    live = key_bias > float("-inf")
    soft = (key_bias.masked_fill(~live, 0.0) != 0).sum()
    live = live.expand(b, -1)
    n = live.sum(dim=1)
    n_max, n_min, soft = torch.stack([n.max(), n.min(), soft]).tolist()
    if soft or n_min == 0:
        return None
    order = torch.argsort((~live).to(torch.uint8), dim=1, stable=True)[:, :n_max]   # valid keys first
    k_out, v_out = k.new_empty(b, hkv, n_max, d), v.new_empty(b, hkv, n_max, d)
    for i in range(b):
        torch.index_select(k[i], 1, order[i], out=k_out[i])
        torch.index_select(v[i], 1, order[i], out=v_out[i])
    pos = torch.arange(n_max, device=k.device)
    bias = torch.zeros(b, n_max, dtype=torch.float32, device=k.device).masked_fill(pos >= n[:, None], float("-inf"))
    return k_out, v_out, bias, n.to(torch.int32)
