"""A PNG contact sheet for a README: per prompt, a few evenly spaced frames of baseline, sagegen and the
amplified difference."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from sagegen.report.frames import BASELINE_LABEL, CANDIDATE_LABEL, DIFF_GAIN, amplified_diff, fit, font

BG = (250, 250, 250)
FG = (20, 20, 20)


def contact_sheet(
    rows: list[tuple[str, np.ndarray, np.ndarray]],
    n_frames: int = 4,
    thumb: int = 160,
    gain: float = DIFF_GAIN,
    title: str | None = None,
) -> np.ndarray:
    """``rows``: (prompt, baseline TxHxWx3, candidate TxHxWx3). Returns the sheet as HxWx3 uint8."""
    label_w, pad, head = 92, 6, 20
    blocks = []
    width = None
    for prompt, base, cand in rows:
        idx = np.unique(np.linspace(0, base.shape[0] - 1, min(n_frames, base.shape[0])).round().astype(int))
        lines = []
        for name, get in ((BASELINE_LABEL, lambda t: base[t]), (CANDIDATE_LABEL, lambda t: cand[t]),
                          (f"|diff|×{gain:g}", lambda t: amplified_diff(cand[t], base[t], gain))):
            thumbs = [fit(get(t), thumb) for t in idx]
            lines.append((name, thumbs))
        th, tw = lines[0][1][0].shape[:2]
        w = label_w + len(idx) * (tw + pad) + pad
        h = head + 3 * (th + pad) + pad
        im = Image.new("RGB", (w, h), BG)
        d = ImageDraw.Draw(im)
        text = textwrap.shorten(prompt, width=max(20, w // 7), placeholder="…")
        d.text((pad, 3), text, fill=FG, font=font(13))
        for r, (name, thumbs) in enumerate(lines):
            y = head + r * (th + pad)
            d.text((pad, y + th // 2 - 7), name, fill=FG, font=font(12))
            for c, t in enumerate(thumbs):
                im.paste(Image.fromarray(t), (label_w + c * (tw + pad), y))
        blocks.append(np.asarray(im))
        width = max(width or 0, w)
    if title:  # the sheet is at least as wide as its title (one small image made it cut the title off)
        title_w = int(ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(title, font=font(15))) + 12
        width = max(width or 0, title_w)
        tb = Image.new("RGB", (width, 26), BG)
        ImageDraw.Draw(tb).text((6, 5), title, fill=FG, font=font(15))
        blocks.insert(0, np.asarray(tb))
    out = [np.pad(b, ((0, 0), (0, (width or b.shape[1]) - b.shape[1]), (0, 0)), constant_values=BG[0]) for b in blocks]
    sep = np.full((2, width or 1, 3), 200, np.uint8)
    stacked = []
    for i, b in enumerate(out):
        stacked.append(b)
        if i < len(out) - 1:
            stacked.append(sep)
    return np.concatenate(stacked, axis=0)


def write_contact_sheet(path: str | Path, rows, **kw) -> Path:
    import io

    from sagegen.runs.directory import atomic_write_bytes

    buf = io.BytesIO()
    Image.fromarray(contact_sheet(rows, **kw)).save(buf, format="PNG", optimize=True)
    return atomic_write_bytes(path, buf.getvalue())
