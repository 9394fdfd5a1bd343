"""Synthetic video-like attention inputs: tokens on a frames x height x width grid whose attention decays with
distance, as in video DiTs (random weights have no such structure, so the predictor is checked on these).

Q and K carry each token's (f, h, w) position as cos/sin features (so q_i·k_j is a smooth kernel of the
distance) plus random content (noise in the scores); V is a smooth function of position plus noise.
Optional text tokens (random, no position) go before or after the video tokens.
"""

from __future__ import annotations

import math

import torch


def grid_positions(frames: int, height: int, width: int, device=None) -> torch.Tensor:
    """[F*H*W, 3] float (f, h, w) of each video token in raster order (frame-major, then rows, then columns)."""
    f, h, w = torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij")
    return torch.stack([f, h, w], dim=-1).reshape(-1, 3).float().to(device)


def video_qkv(frames: int = 8, height: int = 16, width: int = 16, *, heads: int = 2, head_dim: int = 64,
              batch: int = 1, length: tuple[float, float, float] = (0.6, 1.5, 1.5), noise: float = 0.5,
              text: int = 0, text_first: bool = False, dtype=torch.bfloat16,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [batch, heads, N, head_dim] (N = frames*height*width + text), meant for sm_scale =
    1/sqrt(head_dim).

    Scores (times sm_scale) are sum over the axes a of beta_a * cos(pi * (x_a - y_a) / extent_a): a smooth
    kernel, monotone over the whole grid, that drops by ~(distance / length_a)^2 / 2 near 0 (so `length` is
    the correlation length in frames, rows, columns), plus noise of std `noise` (nats) from random content
    dimensions; everything is turned by a random rotation per head so no channel is special."""
    g = generator
    d = head_dim
    pos = grid_positions(frames, height, width)
    n = pos.shape[0]
    extent = torch.tensor([frames, height, width], dtype=torch.float32)
    beta = (extent / (math.pi * torch.tensor(length))) ** 2
    theta = math.pi * pos / extent
    amp = (beta * math.sqrt(d)).sqrt()
    feats = torch.cat([torch.cos(theta) * amp, torch.sin(theta) * amp], dim=1)  # [n, 6]
    out = [torch.empty(batch, heads, n + text, d) for _ in range(3)]
    for h in range(heads):
        rot = torch.linalg.qr(torch.randn(d, d, generator=g))[0]
        for b in range(batch):
            parts = []
            for _ in range(2):  # q, k: the position features, plus random content
                content = torch.randn(n, d - 6, generator=g) * math.sqrt(noise) * d ** 0.25 / (d - 6) ** 0.25
                parts.append(torch.cat([feats, content], dim=1) @ rot)
            vv = torch.sin(pos @ torch.randn(3, d, generator=g) * 0.5) + 0.3 * torch.randn(n, d, generator=g)
            for t, val in zip(out, (*parts, vv)):
                txt = torch.randn(text, d, generator=g) * val.std()
                t[b, h] = torch.cat([txt, val]) if text_first else torch.cat([val, txt])
    return tuple(t.to(dtype) for t in out)


def attention_probs(q: torch.Tensor, k: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """Exact softmax probabilities [B, H, Nq, Nk] in fp64 (small inputs only)."""
    group = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(group, dim=1) if group > 1 else k.double()
    return torch.softmax((q.double() @ kd.transpose(-1, -2)) * sm_scale, dim=-1)


def kept_mass(probs: torch.Tensor, keep: torch.Tensor, block_q: int, block_kv: int) -> torch.Tensor:
    """Per query row, the attention mass inside the kept blocks: [B, H, Nq] fp64."""
    nq, nk = probs.shape[-2:]
    dense = keep.repeat_interleave(block_q, dim=2)[:, :, :nq].repeat_interleave(block_kv, dim=3)[..., :nk]
    return (probs * dense).sum(-1)


DISTRIBUTIONS = ("gaussian", "video", "channel_bias_outliers", "sharp", "sinks", "low_rank_keys")


def distribution_qkv(kind: str, n: int = 1024, *, heads: int = 2, head_dim: int = 128, batch: int = 1,
                     seed: int = 0, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [batch, heads, n, head_dim] of one of `DISTRIBUTIONS`, for accuracy studies of the quantized
    numerics at sm_scale = 1/sqrt(head_dim):

    - ``gaussian``: i.i.d. N(0, 1);
    - ``video``: `video_qkv` (position-smooth scores, as video DiTs; n rounded to a 4 x h x w grid);
    - ``channel_bias_outliers``: K with a large per-channel bias shared by all tokens (what K-smoothing removes)
      and, in Q and K, 4 outlier channels 20x the others (what per-block INT8 scales suffer from);
    - ``sharp``: Q and K scaled so the softmax is nearly one-hot (scores spread ~±25);
    - ``sinks``: 4 keys that every query attends to strongly (attention sinks), the rest Gaussian;
    - ``low_rank_keys``: K in a rank-4 subspace plus 1% noise (scores dominated by a few directions).
    """
    g = torch.Generator().manual_seed(seed)
    d = head_dim
    shape = (batch, heads, n, d)
    if kind == "video":
        side = max(2, int(round((n / 4) ** 0.5)))
        return video_qkv(4, side, side, heads=heads, head_dim=d, batch=batch, dtype=dtype, generator=g)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    if kind == "gaussian":
        pass
    elif kind == "channel_bias_outliers":
        k = k + 4.0 * torch.randn(1, heads, 1, d, generator=g)
        ch = torch.randperm(d, generator=g)[:4]
        q[..., ch] *= 20.0
        k[..., ch] *= 20.0
        v = v + 2.0 * torch.randn(1, heads, 1, d, generator=g)
    elif kind == "sharp":
        q, k = q * 3.0, k * 3.0
    elif kind == "sinks":
        sink_dir = torch.randn(1, heads, 1, d, generator=g)
        sink_dir = sink_dir / sink_dir.norm(dim=-1, keepdim=True)
        q = q + 3.0 * sink_dir
        idx = torch.randperm(n, generator=g)[:4]
        k[:, :, idx] = k[:, :, idx] + 8.0 * sink_dir * d ** 0.5 / 3.0
    elif kind == "low_rank_keys":
        basis = torch.randn(batch, heads, 4, d, generator=g)
        k = torch.randn(batch, heads, n, 4, generator=g) @ basis / 2.0 + 0.01 * k
    else:
        raise ValueError(f"kind must be one of {DISTRIBUTIONS}; got {kind!r}")
    return q.to(dtype), k.to(dtype), v.to(dtype)
