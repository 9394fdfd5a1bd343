"""FID and KID between two sets of images (frames), on Inception pool features.

The feature extractor is loaded from a local file (see :func:`sagegen.eval.weights.resolve_inception`):

* a TorchScript module, e.g. ``inception-2015-12-05.pt`` (the TF-Inception FID weights as TorchScript, used by
  StyleGAN and clean-fid): called on Nx3x299x299 float images in 0..255 as ``m(x, return_features=True)``
  (or ``m(x)`` when it takes no such argument); must return NxD features;
* a torchvision Inception-v3 state dict (``inception_v3_google-*.pth``, or pytorch-fid's
  ``pt_inception-*.pth`` with 1008 classes): run as torchvision's ``Inception3`` on images scaled to [-1, 1],
  2048-d pool features. Numbers from these are *not* comparable to published FIDs, which use the TF weights.

Images are resized to 299x299 with PIL's bicubic filter from the uint8 frames (clean-fid's "clean" resize).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

INCEPTION_SIZE = 299
FID_RELIABLE_N = 2048  # below the feature dimension the covariance estimate is rank-deficient


@dataclass
class FeatureExtractor:
    fn: Callable[[torch.Tensor], torch.Tensor]  # Nx3x299x299 float 0..255 -> NxD
    label: str
    comparable: bool  # True for the TF FID weights (TorchScript)

    @torch.no_grad()
    def __call__(self, frames: np.ndarray, batch: int = 16) -> np.ndarray:
        from PIL import Image

        out = []
        for i in range(0, frames.shape[0], batch):
            chunk = [
                np.asarray(Image.fromarray(f).resize((INCEPTION_SIZE, INCEPTION_SIZE), Image.BICUBIC))
                for f in frames[i : i + batch]
            ]
            x = torch.from_numpy(np.stack(chunk)).permute(0, 3, 1, 2).float()
            out.append(self.fn(x).reshape(x.shape[0], -1).double().numpy())
        return np.concatenate(out)


def _torchvision_inception(state: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    from torchvision.models import Inception3

    num_classes = int(state["fc.weight"].shape[0]) if "fc.weight" in state else 1000
    aux = any(k.startswith("AuxLogits.") for k in state)
    net = Inception3(num_classes=num_classes, aux_logits=aux, transform_input=False, init_weights=False)
    net.load_state_dict(state, strict=True)
    net.fc = torch.nn.Identity()
    net.eval()

    def run(x: torch.Tensor) -> torch.Tensor:
        out = net(x / 127.5 - 1.0)
        return out[0] if isinstance(out, tuple) else out

    return run


def load_inception(path: str | Path) -> FeatureExtractor:
    path = Path(path)
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # TorchScript is the format the FID weights ship in
            mod = torch.jit.load(str(path), map_location="cpu").eval()
    except Exception:
        mod = None
    if mod is not None:
        probe = torch.zeros(1, 3, INCEPTION_SIZE, INCEPTION_SIZE)
        try:
            with torch.no_grad():
                mod(probe, return_features=True)
            fn = lambda x: mod(x, return_features=True)  # noqa: E731
        except Exception:
            fn = mod
        return FeatureExtractor(fn=fn, label=f"TorchScript {path.name}", comparable=True)
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"--inception-weights {path}: neither TorchScript nor a state dict ({e})") from e
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict) or "Mixed_7c.branch_pool.conv.weight" not in state:
        raise ValueError(f"--inception-weights {path}: state dict is not torchvision Inception-v3")
    return FeatureExtractor(
        fn=_torchvision_inception(state), label=f"torchvision Inception3 {path.name}", comparable=False
    )


# ----------------------------------------------------------------------------------------------- metrics


def _stats(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    f = np.asarray(feats, dtype=np.float64)
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"FID needs at least 2 feature vectors, got shape {f.shape}")
    return f.mean(axis=0), np.cov(f, rowvar=False)


def _psd_sqrt(a: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((a + a.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(mu1: np.ndarray, s1: np.ndarray, mu2: np.ndarray, s2: np.ndarray) -> float:
    """||mu1-mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2)); the trace of the root is taken as the sum of square roots
    of the eigenvalues of S1^(1/2) S2 S1^(1/2) (symmetric PSD, so stable for singular covariances)."""
    r1 = _psd_sqrt(s1)
    m = r1 @ s2 @ r1
    tr_root = float(np.sqrt(np.clip(np.linalg.eigvalsh((m + m.T) / 2), 0, None)).sum())
    d = mu1 - mu2
    return float(max(0.0, d @ d + np.trace(s1) + np.trace(s2) - 2.0 * tr_root))


def fid_from_features(a: np.ndarray, b: np.ndarray) -> float:
    return frechet_distance(*_stats(a), *_stats(b))


def kid_from_features(
    a: np.ndarray, b: np.ndarray, n_subsets: int = 100, subset_size: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """KID (Binkowski et al. 2018): unbiased MMD^2 with the kernel (x.y/d + 1)^3, averaged over random
    subsets. Returns (mean, std over subsets)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m = min(subset_size, a.shape[0], b.shape[0])
    if m < 2:
        raise ValueError("KID needs at least 2 samples per set")
    d = a.shape[1]
    if m == a.shape[0] == b.shape[0]:
        n_subsets = 1  # every "subset" would be the whole of both sets
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(n_subsets):
        x = a[rng.choice(a.shape[0], m, replace=False)]
        y = b[rng.choice(b.shape[0], m, replace=False)]
        kxx = (x @ x.T / d + 1) ** 3
        kyy = (y @ y.T / d + 1) ** 3
        kxy = (x @ y.T / d + 1) ** 3
        mmd = (
            (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
            + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
            - 2 * kxy.mean()
        )
        vals.append(mmd)
    v = np.asarray(vals)
    return float(v.mean()), float(v.std())


def fid_warning(n: int, dim: int) -> str | None:
    if n < max(FID_RELIABLE_N, dim):
        return (
            f"FID from {n} images (< {max(FID_RELIABLE_N, dim)}, the feature dimension): the covariance is "
            "rank-deficient, so FID is biased upward and unreliable; compare with KID or use more samples"
        )
    return None


def features_of(extract: FeatureExtractor, clips: Iterable[np.ndarray]) -> np.ndarray:
    return np.concatenate([extract(c) for c in clips])
