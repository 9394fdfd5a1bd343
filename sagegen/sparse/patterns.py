"""Static block masks from a video's latent grid: sliding-tile windows (STA) and radial decay.

Tokens are numbered in raster order over (frames, height, width) -- the order of Wan, HunyuanVideo,
CogVideoX and Mochi after patchifying -- with the text tokens before (CogVideoX) or after (HunyuanVideo, Mochi)
the video tokens, or none (Wan's self-attention; its text comes through cross-attention). `VIDEO_TOKEN_ORDER`
records that per family; Flux and SD3 are images (no time axis) and get no static pattern.

A block of tokens covers a box of the grid (the bounding box of its video tokens: a 128-token block of a
45 x 80 latent spans two rows and the width). Two blocks' distance along an axis is the gap between their
boxes (0 when they overlap). STA keeps a block pair when every gap is within the window; radial keeps it when
the spatial gaps are within a window that halves every `decay` frames of temporal gap. Both always keep text
rows/columns and (keep_first) the first key block, an attention sink.
"""

from __future__ import annotations

import torch

from sagegen.sparse.sparse_config import SparseConfig

# family -> where its text tokens sit relative to the video tokens in self-attention (None: no text there)
VIDEO_TOKEN_ORDER = {
    "hunyuanvideo": "video_text",   # joint attention: [video (f, h, w), text]
    "mochi": "video_text",          # joint attention: [video, text] (fused path: video then valid text)
    "cogvideox": "text_video",      # joint attention: [text (226), video]
    "wan": None,                    # self-attention over video only; text via cross-attention
}


def text_range(cfg: SparseConfig, n: int) -> tuple[int, int] | None:
    """[start, stop) of the text tokens in a sequence of n: cfg.text, else what the grid leaves over."""
    if cfg.text is not None:
        return cfg.text
    if cfg.grid is None:
        return None
    video = cfg.grid[0] * cfg.grid[1] * cfg.grid[2]
    if video >= n:
        return None
    return (video, n) if cfg.token_order == "video_text" else (0, n - video)


def block_boxes(cfg: SparseConfig, n: int, block: int, device, offset: int = 0, total: int | None = None):
    """Per block of `block` tokens: (lo [NB, 3], hi [NB, 3]) of its video tokens' (f, h, w), and whether it
    holds any video token [NB] (text-only blocks have lo = +big, hi = -big). ``offset`` / ``total``: the n
    tokens are positions [offset, offset + n) of a sequence of ``total`` (a query window under Ring)."""
    f, h, w = cfg.grid
    video = f * h * w
    total = n if total is None else total
    start = 0 if cfg.token_order == "video_text" else max(0, total - video)
    t = offset + torch.arange(n, device=device) - start
    is_video = (t >= 0) & (t < video)
    tc = t.clamp(0, video - 1)
    coords = torch.stack([tc // (h * w), (tc // w) % h, tc % w], dim=-1)
    nb = -(-n // block)
    pad = nb * block - n
    big = 1 << 30
    lo = torch.where(is_video[:, None], coords, big)
    hi = torch.where(is_video[:, None], coords, -big)
    lo = torch.nn.functional.pad(lo, (0, 0, 0, pad), value=big).view(nb, block, 3).amin(1)
    hi = torch.nn.functional.pad(hi, (0, 0, 0, pad), value=-big).view(nb, block, 3).amax(1)
    has_video = torch.nn.functional.pad(is_video, (0, pad)).view(nb, block).any(1)
    return lo, hi, has_video


def _gaps(cfg, n_q, n_k, block_q, block_kv, device, q_offset=None):
    qlo, qhi, qv = block_boxes(cfg, n_q, block_q, device, q_offset or 0, None if q_offset is None else n_k)
    klo, khi, kv = block_boxes(cfg, n_k, block_kv, device)
    gap = torch.maximum(klo[None, :, :] - qhi[:, None, :], qlo[:, None, :] - khi[None, :, :]).clamp_min(0)
    return gap, qv[:, None] & kv[None, :]  # gap [NQB, NKB, 3]


def static_keep(cfg: SparseConfig, n_q: int, n_k: int, block_q: int, block_kv: int, device,
                q_offset: int | None = None) -> torch.Tensor:
    """bool [1, 1, NQB, NKB]: the static pattern (cfg.mode "sta" or "radial") for this call. ``q_offset``: the
    queries are positions [q_offset, q_offset + n_q) of a self-attention over the n_k keys (Ring)."""
    if cfg.grid is None:
        raise ValueError(f"SparseConfig(mode={cfg.mode!r}) needs grid=(frames, height, width)")
    gap, both_video = _gaps(cfg, n_q, n_k, block_q, block_kv, device, q_offset)
    wf, wh, ww = cfg.window
    if cfg.mode == "sta":
        inside = (gap[..., 0] <= wf) & (gap[..., 1] <= wh) & (gap[..., 2] <= ww)
    elif cfg.mode == "radial":
        shrink = torch.pow(2.0, (gap[..., 0] // cfg.decay).float())
        inside = (gap[..., 1] <= wh / shrink) & (gap[..., 2] <= ww / shrink)
    else:
        raise ValueError(f"static_keep: mode {cfg.mode!r} is not a static pattern")
    keep = both_video & inside
    nqb, nkb = keep.shape
    from sagegen.sparse.predictor import block_range, diagonal, is_self_attention

    text = text_range(cfg, n_q if q_offset is None else n_k)
    if text is not None:
        window = {} if q_offset is None else {"offset": q_offset, "total": n_k}
        keep = keep | block_range(*text, n_q, block_q, device, **window)[:, None]
        keep = keep | block_range(*text_range(cfg, n_k), n_k, block_kv, device)[None, :]
    if cfg.keep_first:
        keep[:, 0] = True
    if cfg.keep_diagonal and is_self_attention(n_q, n_k, q_offset):
        keep = keep | diagonal(nqb, nkb, block_q, block_kv, device, q_offset or 0)
    return keep[None, None]


def to_flex(cfg: SparseConfig, n_q: int, n_k: int, block: int = 128, device=None):
    """The static pattern as FlexAttention's `BlockMask` (block x block, whole blocks: no partial ones)."""
    from sagegen.sparse.block_masks import to_flex_block_mask

    keep = static_keep(cfg, n_q, n_k, block, block, device)
    from sagegen.kernels.block_sparse import BlockSparse

    return to_flex_block_mask(BlockSparse.from_block_dense(keep, block, block), n_q, n_k)
