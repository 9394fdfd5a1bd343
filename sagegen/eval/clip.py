"""CLIP-based scores: CLIPSIM (frame-to-prompt similarity, averaged over frames), CLIP-T (similarity of
consecutive frames, averaged) and CLIPScore (image-to-prompt, for image models), with open-clip-torch.

Two preprocessing modes:

``evalcrafter``
    Reproduces EvalCrafter's ``Scores_with_CLIP`` metrics (the CLIPSIM / CLIP-Temp numbers in the
    SageAttention2 paper): OpenAI CLIP ViT-B/32; every frame is squashed to 224x224 (no aspect-preserving
    crop) and fed to the image tower as raw 0..255 values, *without* the usual /255 and mean/std
    normalisation. For CLIPSIM the resize is OpenCV's ``INTER_LINEAR`` on the uint8 frame (result rounded back
    to uint8); for CLIP-T it is a bilinear resize of the float frame without antialiasing (torchvision 0.15's
    tensor ``Resize``). Scores are plain cosine similarities (not x100, not clamped). One deliberate
    difference: frames come from the lossless PNGs, where EvalCrafter decodes the generated MP4 with OpenCV.
    EvalCrafter loads the weights through transformers (``openai/clip-vit-base-patch32``); open_clip's
    ``ViT-B-32`` + ``openai`` tag is the same network and weights (QuickGELU, EOT-token pooling).
``standard``
    The model's own open_clip preprocessing (shortest-side resize, centre crop, /255, mean/std normalise);
    the same cosine similarities.

CLIPScore (image models) always uses ``standard`` preprocessing and reports ``100 * max(cos, 0)`` with the prompt
as given: torchmetrics' convention. It is *not* Hessel et al.'s original CLIP-S, ``2.5 * max(cos, 0)`` with
"A photo depicts " prepended to the caption; the two scales differ by 40x plus the prompt change, so numbers
from one cannot be compared with the other.
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from sagegen.eval.weights import ClipSource

MODES = ("evalcrafter", "standard")


@dataclass
class ClipModel:
    model: torch.nn.Module
    tokenizer: Callable
    preprocess: Callable  # PIL.Image -> 3xHxW tensor (the model's standard eval transform)
    image_size: tuple[int, int]
    label: str
    is_evalcrafter_model: bool = False

    @torch.no_grad()
    def encode_images(self, x: torch.Tensor, batch: int = 16) -> torch.Tensor:
        outs = [self.model.encode_image(x[i : i + batch]) for i in range(0, x.shape[0], batch)]
        f = torch.cat(outs).float()
        return f / f.norm(dim=-1, keepdim=True)

    @torch.no_grad()
    def encode_text(self, texts: list[str]) -> torch.Tensor:
        f = self.model.encode_text(self.tokenizer(texts)).float()
        return f / f.norm(dim=-1, keepdim=True)


def load_clip(src: ClipSource) -> ClipModel:
    import open_clip

    kwargs: dict = {}
    if src.force_quick_gelu:
        kwargs["force_quick_gelu"] = True
    # The pretrained tag's preprocessing goes through create_model_and_transforms' own image_* arguments:
    # it builds force_preprocess_cfg from them itself, so passing force_preprocess_cfg too is a TypeError.
    accepted = inspect.signature(open_clip.create_model_and_transforms).parameters
    for key in ("mean", "std", "interpolation", "resize_mode"):
        if key in src.preprocess_cfg and f"image_{key}" in accepted:
            value = src.preprocess_cfg[key]
            kwargs[f"image_{key}"] = tuple(value) if isinstance(value, (list, tuple)) else value
    model, _, preprocess = open_clip.create_model_and_transforms(
        src.arch, pretrained=src.checkpoint, **kwargs
    )
    model.eval()
    tokenizer = open_clip.get_tokenizer(src.arch)
    size = model.visual.image_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    return ClipModel(model, tokenizer, preprocess, size, src.label, src.is_evalcrafter_model)


# ------------------------------------------------------------------------------------------ preprocessing


def has_exact_resize() -> bool:
    """True when OpenCV is installed, so EvalCrafter's CLIPSIM resize is reproduced exactly."""
    return importlib.util.find_spec("cv2") is not None


APPROX_RESIZE_NOTE = ("OpenCV is not installed, so EvalCrafter's cv2.resize is approximated (off by 1 on about 11% "
                      "of pixel values); pip install opencv-python-headless (in sagegen's eval extra) for the "
                      "exact one")


def resize_uint8_linear(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """OpenCV ``cv2.resize(frame, (w, h))`` with ``INTER_LINEAR`` on uint8 frames: half-pixel-centre
    bilinear, no antialiasing, rounded back to uint8. Exact with OpenCV installed (the ``eval`` extra);
    without it, an approximation: float bilinear rounded to nearest, where OpenCV's fixed-point arithmetic
    (11-bit weights) rounds differently, off by 1 on about 11% of pixel values."""
    if has_exact_resize():
        import cv2

        return np.stack([cv2.resize(f, (size[1], size[0]), interpolation=cv2.INTER_LINEAR) for f in frames])
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).double()
    y = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=False)
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def evalcrafter_clipsim_input(frames: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """TxHxWx3 uint8 -> Tx3xhxw float in 0..255 (unnormalised), as EvalCrafter's CLIPSIM feeds CLIP."""
    return torch.from_numpy(resize_uint8_linear(frames, size)).permute(0, 3, 1, 2).float()


def evalcrafter_clipt_input(frames: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """TxHxWx3 uint8 -> Tx3xhxw float in 0..255 (unnormalised), bilinear without antialias, not rounded."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=False)


def standard_input(clip: ClipModel, frames: np.ndarray) -> torch.Tensor:
    from PIL import Image

    return torch.stack([clip.preprocess(Image.fromarray(f)) for f in frames])


# ------------------------------------------------------------------------------------------------ scores


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"--clip-mode must be one of {', '.join(MODES)}; got {mode!r}")


def frame_text_similarities(clip: ClipModel, frames: np.ndarray, prompt: str, mode: str) -> list[float]:
    """Cosine similarity of each frame to the prompt."""
    _check_mode(mode)
    x = evalcrafter_clipsim_input(frames, clip.image_size) if mode == "evalcrafter" else standard_input(clip, frames)
    img = clip.encode_images(x)
    txt = clip.encode_text([prompt])
    return (img @ txt.T).squeeze(1).tolist()


def clipsim(clip: ClipModel, frames: np.ndarray, prompt: str, mode: str) -> float:
    """CLIPSIM: mean over frames of cos(frame, prompt)."""
    return float(np.mean(frame_text_similarities(clip, frames, prompt, mode)))


def consecutive_similarities(clip: ClipModel, frames: np.ndarray, mode: str) -> list[float]:
    _check_mode(mode)
    if frames.shape[0] < 2:
        raise ValueError("CLIP-T needs at least two frames")
    x = evalcrafter_clipt_input(frames, clip.image_size) if mode == "evalcrafter" else standard_input(clip, frames)
    f = clip.encode_images(x)
    return (f[:-1] * f[1:]).sum(dim=1).tolist()


def clipt(clip: ClipModel, frames: np.ndarray, mode: str) -> float:
    """CLIP-T: mean over t of cos(frame_t, frame_t+1)."""
    return float(np.mean(consecutive_similarities(clip, frames, mode)))


def clipscore(clip: ClipModel, image: np.ndarray, prompt: str) -> float:
    """CLIPScore of one image: 100 * max(cos(image, prompt), 0), standard preprocessing."""
    s = frame_text_similarities(clip, image[None] if image.ndim == 3 else image[:1], prompt, "standard")[0]
    return 100.0 * max(s, 0.0)
