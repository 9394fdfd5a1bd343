"""Frame helpers shared by the report pieces: labels, difference images, resizing, encoding."""

from __future__ import annotations

import base64
import io
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

BASELINE_LABEL = "baseline"
CANDIDATE_LABEL = "sagegen"
DIFF_GAIN = 8.0


@lru_cache(maxsize=8)
def font(size: int = 14) -> ImageFont.ImageFont:
    for name in ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "LiberationSans-Regular.ttf"):
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def amplified_diff(a: np.ndarray, b: np.ndarray, gain: float = DIFF_GAIN) -> np.ndarray:
    """|a - b| * gain, clipped to 0..255 (uint8; same shape)."""
    d = np.abs(a.astype(np.int16) - b.astype(np.int16)).astype(np.float32) * gain
    return np.clip(d, 0, 255).astype(np.uint8)


def fit(img: np.ndarray, max_side: int) -> np.ndarray:
    """Downscale (never upscale) so the longest side is at most ``max_side``."""
    h, w = img.shape[:2]
    s = max(h, w)
    if s <= max_side:
        return img
    nh, nw = max(1, round(h * max_side / s)), max(1, round(w * max_side / s))
    return np.asarray(Image.fromarray(img).resize((nw, nh), Image.LANCZOS))


def label_bar(width: int, text: str, height: int = 22, fg=(255, 255, 255), bg=(24, 24, 24)) -> np.ndarray:
    im = Image.new("RGB", (width, height), bg)
    d = ImageDraw.Draw(im)
    f = font(max(10, height - 8))
    box = d.textbbox((0, 0), text, font=f)
    d.text(((width - (box[2] - box[0])) // 2, (height - (box[3] - box[1])) // 2 - box[1]), text, fill=fg, font=f)
    return np.asarray(im)


def labelled(img: np.ndarray, text: str, bar: int = 22) -> np.ndarray:
    return np.concatenate([label_bar(img.shape[1], text, bar), img], axis=0)


def side_by_side(frames: list[np.ndarray], labels: list[str], gap: int = 4, bar: int = 22) -> np.ndarray:
    """Frames of equal height, each with a label bar on top, left to right with a dark gap."""
    h = max(f.shape[0] for f in frames)
    tiles = []
    for i, (f, t) in enumerate(zip(frames, labels)):
        if f.shape[0] != h:
            f = np.asarray(Image.fromarray(f).resize((round(f.shape[1] * h / f.shape[0]), h), Image.LANCZOS))
        tiles.append(labelled(f, t, bar))
        if i < len(frames) - 1:
            tiles.append(np.full((h + bar, gap, 3), 24, np.uint8))
    return np.concatenate(tiles, axis=1)


def even(img: np.ndarray) -> np.ndarray:
    """Pad by one pixel (edge) where a side is odd: H.264 yuv420p needs even sizes."""
    h, w = img.shape[:2]
    return np.pad(img, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge") if (h % 2 or w % 2) else img


def encode(img: np.ndarray, fmt: str = "JPEG", quality: int = 88) -> bytes:
    buf = io.BytesIO()
    im = Image.fromarray(img)
    if fmt == "JPEG":
        im.save(buf, format="JPEG", quality=quality, subsampling=0 if quality >= 90 else 2)
    else:
        im.save(buf, format=fmt, optimize=True)
    return buf.getvalue()


def data_uri(img: np.ndarray, fmt: str = "JPEG", quality: int = 88) -> str:
    mime = "image/jpeg" if fmt == "JPEG" else f"image/{fmt.lower()}"
    return f"data:{mime};base64," + base64.b64encode(encode(img, fmt, quality)).decode("ascii")
