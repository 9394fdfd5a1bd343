"""FID and KID between two sets of images (frames), on Inception pool features.

The feature extractor is loaded from a local file (see :func:`sagegen.eval.weights.resolve_inception`):

* a TorchScript module, e.g. ``inception-2015-12-05.pt`` (the TF-Inception FID weights as TorchScript, used by
  StyleGAN and clean-fid): called on Nx3x299x299 float images in 0..255 as ``m(x, return_features=True)``
  (or ``m(x)`` when it takes no such argument); must return NxD features;
* pytorch-fid's ``pt_inception-2015-12-05-*.pth`` (a state dict with 1008 classes, no auxiliary logits: the TF
  FID weights ported to PyTorch): run through the FID network of :mod:`sagegen.eval.fid_inception` (the TF
  graph's pooling, as pytorch-fid does) on images scaled to [-1, 1], 2048-d pool features;
* a torchvision Inception-v3 state dict (``inception_v3_google-*.pth``, ImageNet classifier): run as
  torchvision's ``Inception3``. Numbers from these are *not* comparable to published FIDs, which use the TF
  weights.

Images are resized to 299x299 like clean-fid's "clean" mode: each channel separately as a float image (PIL
mode "F", bicubic), clipped to 0..255 and never rounded back to uint8 (rounding adds its own artefacts).

Whether a TorchScript file really is the TF FID Inception cannot be told from its format: sagegen records its
sha256 and says "unverified" instead of claiming the numbers are comparable to published FIDs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from sagegen.eval import fid_inception

INCEPTION_SIZE = 299
INCEPTION_DIM = 2048  # pool features of the FID Inception
FID_RELIABLE_N = 2048  # below this many images FID is biased upward and noisy, even in low dimensions


def clean_resize(frame: np.ndarray, size: int = INCEPTION_SIZE) -> np.ndarray:
    """HxWx3 uint8 -> size x size x 3 float32 in 0..255: bicubic per channel on floats, no quantisation."""
    from PIL import Image

    channels = []
    for c in range(frame.shape[-1]):
        im = Image.fromarray(frame[..., c].astype(np.float32), mode="F").resize((size, size), Image.BICUBIC)
        channels.append(np.asarray(im, dtype=np.float32))
    return np.clip(np.stack(channels, axis=-1), 0.0, 255.0)  # bicubic overshoots; clean-fid clips too


@dataclass
class FeatureExtractor:
    fn: Callable[[torch.Tensor], torch.Tensor]  # Nx3x299x299 float 0..255 -> NxD
    label: str
    comparable: bool | None  # True: known TF FID weights; False: certainly not; None: cannot tell
    comparability: str = ""  # why, in one line, for metrics.json
    sha256: str | None = None  # of the weights file, so a reader can check which file it was

    @torch.no_grad()
    def __call__(self, frames: np.ndarray, batch: int = 16) -> np.ndarray:
        out = []
        for i in range(0, frames.shape[0], batch):
            chunk = [clean_resize(f) for f in frames[i : i + batch]]
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
        with torch.no_grad():
            try:
                dim = mod(probe, return_features=True).reshape(1, -1).shape[1]
                fn = lambda x: mod(x, return_features=True)  # noqa: E731
            except Exception:
                fn = mod
                dim = mod(probe).reshape(1, -1).shape[1]
        comparable, why = _torchscript_comparability(path, dim)
        return FeatureExtractor(fn=fn, label=f"TorchScript {path.name}", comparable=comparable,
                                comparability=why, sha256=_sha256(path))
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"--inception-weights {path}: neither TorchScript nor a state dict ({e})") from e
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict) or "Mixed_7c.branch_pool.conv.weight" not in state:
        raise ValueError(f"--inception-weights {path}: state dict is not torchvision Inception-v3")
    if fid_inception.is_fid_state_dict(state):
        return _pytorch_fid_extractor(path, state)
    return FeatureExtractor(
        fn=_torchvision_inception(state), label=f"torchvision Inception3 {path.name}", comparable=False,
        comparability="torchvision Inception-v3 weights, not the TF FID weights published FIDs use",
        sha256=_sha256(path),
    )


def _pytorch_fid_extractor(path: Path, state: dict) -> FeatureExtractor:
    net = fid_inception.FIDInception(state)
    sha = _sha256(path)
    if sha.startswith(fid_inception.PYTORCH_FID_SHA256_PREFIX):
        comparable, why = True, ("pytorch-fid's port of the TF FID Inception (sha256 starts with "
                                 f"{fid_inception.PYTORCH_FID_SHA256_PREFIX}, as its release file name says), run "
                                 "with the TF graph's pooling; images are resized clean-fid's way (bicubic per "
                                 "channel), where pytorch-fid resizes bilinearly inside the network, so expect "
                                 "small differences from pytorch-fid's own numbers")
    else:
        comparable, why = None, (f"unverified: {path.name} has the FID Inception's layout (1008 classes) and runs "
                                 "through the FID network, but its sha256 is not that of pytorch-fid's "
                                 f"pt_inception-2015-12-05-{fid_inception.PYTORCH_FID_SHA256_PREFIX}.pth")
    return FeatureExtractor(fn=lambda x: net(x / 127.5 - 1.0), label=f"FID Inception (pytorch-fid) {path.name}",
                            comparable=comparable, comparability=why, sha256=sha)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _torchscript_comparability(path: Path, dim: int) -> tuple[bool | None, str]:
    """Any network can be saved as TorchScript, and sagegen has no checksum of the TF FID Inception to check
    the file against: only a wrong feature size proves it is not the FID network."""
    if dim != INCEPTION_DIM:
        return False, (f"{path.name} gives {dim}-d features, not the {INCEPTION_DIM}-d pool features of the "
                       "FID Inception")
    return None, (f"unverified: {path.name} gives {INCEPTION_DIM}-d features, but sagegen cannot check that it is the "
                  "TF FID Inception (inception-2015-12-05.pt); the numbers are comparable to published FIDs only if "
                  "it is (compare extractor_sha256 with your copy)")


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
    value = float(d @ d + np.trace(s1) + np.trace(s2) - 2.0 * tr_root)
    # clamp only the rounding error of a true 0; max(0.0, nan) would turn NaN into a perfect score
    return max(0.0, value) if np.isfinite(value) else value


def _check_finite(feats: np.ndarray, what: str) -> None:
    bad = int((~np.isfinite(feats)).any(axis=1).sum()) if feats.ndim == 2 else 0
    if bad:
        raise ValueError(f"{what}: {bad} of {feats.shape[0]} feature vectors hold NaN/inf values")


def fid_from_features(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    _check_finite(a, "FID")
    _check_finite(b, "FID")
    return frechet_distance(*_stats(a), *_stats(b))


def kid_from_features(
    a: np.ndarray, b: np.ndarray, n_subsets: int = 100, subset_size: int = 1000, seed: int = 0
) -> tuple[float, float | None]:
    """KID (Binkowski et al. 2018): unbiased MMD^2 with the kernel (x.y/d + 1)^3, averaged over random
    subsets. Returns (mean, std over subsets); the std is None when there is only one subset (both sets
    whole), since a spread over one value says nothing."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    _check_finite(a, "KID")
    _check_finite(b, "KID")
    m = min(subset_size, a.shape[0], b.shape[0])
    if m < 2:
        raise ValueError(f"KID needs at least 2 images per set, got {a.shape[0]} and {b.shape[0]}")
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
    return float(v.mean()), (float(v.std()) if len(v) > 1 else None)


def fid_warning(n: int, dim: int) -> str | None:
    if n < dim:
        return (
            f"FID from {n} images (< {dim}, the feature dimension): the covariance is rank-deficient, so FID is "
            "biased upward and unreliable; compare with KID or use more samples"
        )
    if n < FID_RELIABLE_N:
        return (
            f"FID from {n} images (< {FID_RELIABLE_N}): FID is biased upward and noisy at this size, so it is "
            "unreliable; compare with KID or use more samples"
        )
    return None


def kid_warning(n: int, one_subset: bool) -> str | None:
    if n >= 100:
        return None
    if one_subset:
        return (f"KID from only {n} images per set, computed once on the whole sets (no subsets, so no std): "
                "expect it to move a lot with other samples")
    return f"KID from only {n} images per subset: noisy; see its std across subsets"


def features_of(extract: FeatureExtractor, clips: Iterable[np.ndarray]) -> np.ndarray:
    return np.concatenate([extract(c) for c in clips])
