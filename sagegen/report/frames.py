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
VIEW_QUALITY = 95  # JPEG quality of embedded views: q85 4:2:0 added ~10x more error than sage itself makes
PNG_BUDGET = 1.5  # a view is embedded as lossless PNG when that costs at most this many times the JPEG
LABEL_PAD = 6  # px of bar on each side of a label


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


def _label_font(height: int) -> ImageFont.ImageFont:
    return font(max(10, height - 8))


def label_width(text: str, height: int = 22) -> int:
    """Pixels a label bar needs to show ``text`` whole, padding included."""
    box = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), text, font=_label_font(height))
    return box[2] - box[0] + 2 * LABEL_PAD


def label_bar(width: int, text: str, height: int = 22, fg=(255, 255, 255), bg=(24, 24, 24)) -> np.ndarray:
    im = Image.new("RGB", (width, height), bg)
    d = ImageDraw.Draw(im)
    f = _label_font(height)
    box = d.textbbox((0, 0), text, font=f)
    d.text(((width - (box[2] - box[0])) // 2, (height - (box[3] - box[1])) // 2 - box[1]), text, fill=fg, font=f)
    return np.asarray(im)


def labelled(img: np.ndarray, text: str, bar: int = 22) -> np.ndarray:
    return np.concatenate([label_bar(img.shape[1], text, bar), img], axis=0)


def upscale_factor(width: int, min_width: int) -> int:
    """The smallest integer factor that makes ``width`` at least ``min_width`` (1: already wide enough)."""
    return max(1, -(-min_width // max(width, 1)))


def side_by_side(frames: list[np.ndarray], labels: list[str], gap: int = 4, bar: int = 22) -> np.ndarray:
    """Frames of equal height, each with a label bar on top, left to right with a dark gap. Frames too
    narrow for their label are enlarged by an integer factor, nearest neighbour (pixels stay exact blocks),
    so the label is never cut off."""
    h = max(f.shape[0] for f in frames)
    fitted = []
    for f in frames:
        if f.shape[0] != h:
            f = np.asarray(Image.fromarray(f).resize((round(f.shape[1] * h / f.shape[0]), h), Image.LANCZOS))
        fitted.append(f)
    need = max(label_width(t, bar) for t in labels)
    k = upscale_factor(min(f.shape[1] for f in fitted), need)  # one factor for all: tiles keep equal heights
    tiles = []
    for i, (f, t) in enumerate(zip(fitted, labels)):
        if k > 1:
            f = np.repeat(np.repeat(f, k, axis=0), k, axis=1)
        tiles.append(labelled(f, t, bar))
        if i < len(frames) - 1:
            tiles.append(np.full((h * k + bar, gap, 3), 24, np.uint8))
    return np.concatenate(tiles, axis=1)


def even(img: np.ndarray) -> np.ndarray:
    """Pad by one pixel (edge) where a side is odd: H.264 yuv420p needs even sizes."""
    h, w = img.shape[:2]
    return np.pad(img, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge") if (h % 2 or w % 2) else img


def encode(img: np.ndarray, fmt: str = "JPEG", quality: int = VIEW_QUALITY) -> bytes:
    buf = io.BytesIO()
    im = Image.fromarray(img)
    if fmt == "JPEG":  # 4:4:4: halving the chroma smears colour edges, the very places sage differs
        im.save(buf, format="JPEG", quality=quality, subsampling=0)
    else:
        im.save(buf, format=fmt, optimize=True)
    return buf.getvalue()


def _uri(data: bytes, fmt: str) -> str:
    mime = "image/jpeg" if fmt == "JPEG" else f"image/{fmt.lower()}"
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def data_uri(img: np.ndarray, fmt: str = "JPEG", quality: int = VIEW_QUALITY) -> str:
    return _uri(encode(img, fmt, quality), fmt)


def view_uri(img: np.ndarray, quality: int = VIEW_QUALITY) -> str:
    """A frame to look at next to another: lossless PNG where that is cheap (small or flat frames), else
    JPEG at ``quality`` with full-resolution chroma, whose error stays small next to sage's differences."""
    png, jpeg = encode(img, "PNG"), encode(img, "JPEG", quality)
    return _uri(png, "PNG") if len(png) <= PNG_BUDGET * len(jpeg) else _uri(jpeg, "JPEG")
