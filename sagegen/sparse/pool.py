"""Pooled block statistics for the predictor: per block of tokens, the mean vector and a self-similarity.

Self-similarity of a block = mean over its tokens of cos(x_i - c, mean - c), c a per-(batch, head) center
(the sequence's mean over sampled tokens): near 1 when the block's tokens agree (its mean represents them, so
the pooled score is trustworthy), small when they point in different directions. Centering matters: the
Q/K of diffusion models carry a large shared component that would make every block look self-similar.

`pool_blocks` runs the Triton launch (`kernels.triton_pool.pool_blocks`) on CUDA or under the Triton
interpreter, and `pool_blocks_torch` (the same math in PyTorch) elsewhere; tests compare the two.
"""

from __future__ import annotations

import torch

from sagegen.kernels.spec import SAMPLE_TOKENS

_EPS = 1e-12


def center(x: torch.Tensor) -> torch.Tensor:
    """[B, H, D] fp32 mean of x [B, H, N, D] over at most SAMPLE_TOKENS evenly spaced tokens."""
    n = x.shape[2]
    idx = torch.arange(min(n, SAMPLE_TOKENS), device=x.device) * n // min(n, SAMPLE_TOKENS)
    return x[:, :, idx].float().mean(dim=2)


def pool_blocks_torch(x: torch.Tensor, block: int, c: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean [B, H, NB, D] fp32, sim [B, H, NB] fp32) of x [B, H, N, D] per `block` tokens (last one ragged)."""
    B, H, N, D = x.shape
    nb = -(-N // block)
    pad = nb * block - N
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, pad)).view(B, H, nb, block, D)
    counts = torch.full((nb,), float(block), device=x.device)
    counts[-1] = block - pad
    mean = xf.sum(dim=3) / counts[:, None]
    c = center(x) if c is None else c.float()
    xc = xf - c[:, :, None, None, :]
    mc = mean - c[:, :, None, :]
    dots = (xc * mc[:, :, :, None, :]).sum(-1)
    norms = xc.norm(dim=-1) * mc.norm(dim=-1)[..., None]
    cos = dots / norms.clamp_min(_EPS)
    valid = (torch.arange(nb * block, device=x.device) < N).view(nb, block)
    sim = (cos * valid).sum(-1) / counts
    return mean, sim


def pool_blocks(x: torch.Tensor, block: int, c: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """As `pool_blocks_torch`, by the Triton launch where it can run (CUDA, or TRITON_INTERPRET=1)."""
    from sagegen.kernels import triton_pool, triton_quant

    if x.is_cuda or triton_quant.interpreting():
        return triton_pool.pool_blocks(x, block, center(x) if c is None else c)
    return pool_blocks_torch(x, block, c)
