"""Paired fidelity of a candidate frame against the baseline frame: PSNR, SSIM and LPIPS.

All three take uint8 RGB frames (HxWx3, or TxHxWx3 for a clip) read from the lossless PNGs; they are never
computed on decoded video.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

PSNR_CAP_DB = 100.0  # identical frames have infinite PSNR; reported as this cap so JSON stays finite
DATA_RANGE = 255.0


def _as_clip(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected HxWx3 or TxHxWx3 RGB frames, got shape {x.shape}")
    return x


def _check_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = _as_clip(a), _as_clip(b)
    if a.shape != b.shape:
        raise ValueError(f"frame shapes differ: baseline {b.shape} vs candidate {a.shape}")
    return a, b


def psnr_frames(a: np.ndarray, b: np.ndarray) -> list[float]:
    """PSNR in dB per frame (all pixels and channels, peak 255), capped at ``PSNR_CAP_DB``."""
    a, b = _check_pair(a, b)
    diff = a.astype(np.float64) - b.astype(np.float64)
    mse = (diff * diff).reshape(diff.shape[0], -1).mean(axis=1)
    out = []
    for m in mse:
        out.append(PSNR_CAP_DB if m == 0 else min(PSNR_CAP_DB, 10.0 * math.log10(DATA_RANGE**2 / m)))
    return out


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    ax = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(ax**2) / (2 * sigma**2))
    return g / g.sum()


def ssim_frames(a: np.ndarray, b: np.ndarray, win: int = 11, sigma: float = 1.5) -> list[float]:
    """SSIM (Wang et al. 2004) per frame: Gaussian 11x11 window, sigma 1.5, K1=0.01, K2=0.03, peak 255,
    computed per RGB channel over the valid region and averaged over channels and positions."""
    a, b = _check_pair(a, b)
    c1, c2 = (0.01 * DATA_RANGE) ** 2, (0.03 * DATA_RANGE) ** 2
    g = _gaussian_window(win, sigma)
    if min(a.shape[1:3]) < win:
        raise ValueError(f"frames of {a.shape[1]}x{a.shape[2]} are smaller than the {win}px SSIM window")
    kh = g.view(1, 1, win, 1).repeat(3, 1, 1, 1)
    kw = g.view(1, 1, 1, win).repeat(3, 1, 1, 1)

    def blur(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.conv2d(x, kh, groups=3), kw, groups=3)

    out = []
    for fa, fb in zip(a, b):
        x = torch.from_numpy(fa).permute(2, 0, 1)[None].double()
        y = torch.from_numpy(fb).permute(2, 0, 1)[None].double()
        mx, my = blur(x), blur(y)
        sxx = blur(x * x) - mx * mx
        syy = blur(y * y) - my * my
        sxy = blur(x * y) - mx * my
        s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
        out.append(float(s.mean()))
    return out


# ---------------------------------------------------------------- LPIPS (AlexNet variant, v0.1 linear heads)

_LPIPS_SHIFT = (-0.030, -0.088, -0.188)
_LPIPS_SCALE = (0.458, 0.448, 0.450)
_ALEX_TAPS = (1, 4, 7, 9, 11)  # ReLU outputs of torchvision's alexnet.features
_ALEX_CH = (64, 192, 384, 256, 256)
LPIPS_MIN_SIDE = 31  # AlexNet's stride-4 conv and two max-pools leave no pixels for conv3..5 below this


class LPIPS(torch.nn.Module):
    """LPIPS distance (Zhang et al. 2018), AlexNet backbone with the v0.1 learned linear heads.

    Weights come from a state dict with torchvision AlexNet keys ``features.*`` and linear-head keys
    ``lin{i}.model.1.weight`` (the layout of the ``lpips`` package's ``weights/v0.1/alex.pth``); see
    :func:`sagegen.eval.weights.resolve_lpips`.
    """

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models import alexnet

        self.features = alexnet(weights=None).features[: _ALEX_TAPS[-1] + 1]
        self.lins = torch.nn.ModuleList(torch.nn.Conv2d(c, 1, 1, bias=False) for c in _ALEX_CH)
        self.register_buffer("shift", torch.tensor(_LPIPS_SHIFT).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor(_LPIPS_SCALE).view(1, 3, 1, 1))

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        feats = {k[len("features.") :]: v for k, v in state.items() if k.startswith("features.")}
        missing = self.features.load_state_dict(
            {k: v for k, v in feats.items() if int(k.split(".")[0]) < len(self.features)}, strict=True
        )
        del missing
        for i, lin in enumerate(self.lins):
            key = f"lin{i}.model.1.weight"
            if key not in state:
                raise KeyError(f"LPIPS weights lack {key}")
            lin.weight.data.copy_(state[key])

    def _taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in _ALEX_TAPS:
                outs.append(x)
        return outs

    @torch.no_grad()
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a``, ``b``: Nx3xHxW in [-1, 1]. Returns N distances."""
        fa = self._taps((a - self.shift) / self.scale)
        fb = self._taps((b - self.shift) / self.scale)
        total = torch.zeros(a.shape[0], dtype=a.dtype)
        for lin, xa, xb in zip(self.lins, fa, fb):
            na = xa / (xa.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
            nb = xb / (xb.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
            total = total + lin((na - nb) ** 2).mean(dim=(1, 2, 3))
        return total


def load_lpips(path: str | Path | dict) -> LPIPS:
    state = path if isinstance(path, dict) else torch.load(str(path), map_location="cpu", weights_only=True)
    model = LPIPS()
    model.load_weights(state)
    return model.eval()


def lpips_frames(model: LPIPS, a: np.ndarray, b: np.ndarray, batch: int = 4) -> list[float]:
    a, b = _check_pair(a, b)
    if min(a.shape[1:3]) < LPIPS_MIN_SIDE:
        raise ValueError(f"frames of {a.shape[1]}x{a.shape[2]} are too small for LPIPS (AlexNet needs at least "
                         f"{LPIPS_MIN_SIDE}px on each side)")
    out: list[float] = []
    for i in range(0, a.shape[0], batch):
        xa = torch.from_numpy(np.ascontiguousarray(a[i : i + batch])).permute(0, 3, 1, 2).float() / 127.5 - 1
        xb = torch.from_numpy(np.ascontiguousarray(b[i : i + batch])).permute(0, 3, 1, 2).float() / 127.5 - 1
        out.extend(float(v) for v in model(xa, xb))
    return out
