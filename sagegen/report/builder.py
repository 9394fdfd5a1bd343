"""Assemble a run directory's report: report/report.html, report/side_by_side/<id>.mp4 (.png for image
models) and report/contact_sheet.png."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from sagegen.eval.fidelity import psnr_frames
from sagegen.runs.reader import Run, Sample, load_frames, load_run
from sagegen.runs.directory import RunDir, atomic_write_text, write_error

from sagegen.report import html as H
from sagegen.report.contact import write_contact_sheet
from sagegen.report.frames import (BASELINE_LABEL, CANDIDATE_LABEL, DIFF_GAIN, VIEW_QUALITY, amplified_diff, data_uri,
                                   fit, view_uri)
from sagegen.report.summary import sample_metric_rows, summary_metrics
from sagegen.report.video import write_side_by_side_mp4
from sagegen.report.cache_section import cache_html
from sagegen.report.sparse_section import sparse_html

TIMING_KEYS = ("total_s", "denoise_s", "decode_s")


@dataclass
class ReportOptions:
    max_side: int = 384  # longest side of the frames embedded in the HTML
    max_frames: int = 64  # frames per player; longer clips show every k-th frame
    gain: float = DIFF_GAIN
    quality: int = VIEW_QUALITY  # JPEG quality (4:4:4) of embedded views that are not cheap enough as PNG
    mp4: bool = True
    contact: bool = True
    contact_prompts: int = 6


def _label(run: Run, v: str) -> str:
    if v == run.baseline:
        return f"{BASELINE_LABEL} ({v})"
    return CANDIDATE_LABEL if len(run.candidates) == 1 else f"{CANDIDATE_LABEL} ({v})"


def _timings(run: Run) -> dict[str, dict[str, dict]]:
    t = run.manifest.get("timings") or {}
    out: dict[str, dict[str, dict]] = {}
    for v in run.variants:
        for s in run.samples:
            rec = (t.get(v) or {}).get(s.id)
            if rec is None:
                try:
                    rec = json.loads((s.dirs[v] / "sample.json").read_text()).get("timings")
                except (OSError, ValueError):
                    rec = None
            if rec:
                out.setdefault(v, {})[s.id] = rec
    return out


def _speedup(base: float | None, cand: float | None) -> str:
    if not base or not cand:
        return "—"
    return f"{base / cand:.2f}×"


def _timing_rows(run: Run, t: dict, ids: list[str]) -> tuple[list[str], list[list[str]]]:
    head = ["variant", *[k.replace("_s", " (s)") for k in TIMING_KEYS]]
    means: dict[str, dict[str, float | None]] = {}
    rows = []
    for v in run.variants:
        means[v] = {}
        for k in TIMING_KEYS:
            vals = [t.get(v, {}).get(i, {}).get(k) for i in ids]
            vals = [x for x in vals if isinstance(x, (int, float))]
            means[v][k] = float(np.mean(vals)) if vals else None
        rows.append([H.e(_label(run, v)), *[H._fmt(means[v][k], 3) for k in TIMING_KEYS]])
    for c in run.candidates:
        rows.append([f"<b>speedup</b> ({H.e(c)} vs {H.e(run.baseline)})",
                     *[f"<b>{_speedup(means[run.baseline][k], means[c][k])}</b>" for k in TIMING_KEYS]])
    return head, rows


def build_report(
    run_dir: str | Path, opts: ReportOptions | None = None, log: Callable[[str], None] = print
) -> dict[str, Path]:
    opts = opts or ReportOptions()
    run = load_run(run_dir, log=log)
    out = RunDir(run.path).ensure_inside(run.path / "report")  # never write through a link out of the run
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # read-only or full disk: name the folder and what to do
        raise write_error(out, e) from e
    mpath = run.path / "metrics.json"
    mdoc = None
    if mpath.is_file():
        try:
            mdoc = json.loads(mpath.read_text(encoding="utf-8"))
        except ValueError:
            log(f"warning: {mpath} is not valid JSON; the report leaves metrics out")
    video = run.kind == "video"
    timings = _timings(run)
    rows, sheet_rows, written = [], [], {}
    mismatched = []
    for i, s in enumerate(run.samples):
        log(f"  [{i + 1}/{len(run.samples)}] {s.id}")
        try:
            frames = {v: load_frames(s.frame_paths(v)) for v in run.variants}
        except (OSError, ValueError) as e:  # a frame that does not decode: this sample's error, not the report's
            msg = f"sample {s.id}: a frame cannot be read ({type(e).__name__}: {e})"
            log(f"warning: {msg}")
            mismatched.append(msg)
            rows.append({"id": s.id, "prompt": s.prompt, "seed": s.seed, "error": msg})
            continue
        base = frames[run.baseline]
        differ = [f"{c} frames {frames[c].shape} differ from baseline {base.shape}"
                  for c in run.candidates if frames[c].shape != base.shape]
        if differ:  # nothing to compare frame by frame; the other samples still get their report
            msg = f"sample {s.id}: {'; '.join(differ)} (left out of the side-by-side views)"
            log(f"warning: {msg}")
            mismatched.append(msg)
            rows.append({"id": s.id, "prompt": s.prompt, "seed": s.seed, "error": msg})
            continue
        rows.append(_sample_row(run, s, frames, opts, mdoc, timings, out, written))
        if len(sheet_rows) < opts.contact_prompts:
            sheet_rows.append((s.prompt, base, frames[run.candidates[0]]))
    links = [(f"side-by-side {'MP4' if video else 'PNG'}s", "side_by_side/")] if opts.mp4 else []
    if opts.contact and sheet_rows:
        model_name = (run.manifest.get("model") or {}).get("name", "")
        written["contact_sheet"] = write_contact_sheet(
            out / "contact_sheet.png", sheet_rows, gain=opts.gain,
            title=f"sagegen: {model_name} — baseline vs sagegen")
        links.append(("contact sheet (PNG)", "contact_sheet.png"))
    metrics_html, warnings = summary_metrics(run, mdoc)
    left_out = [f"{v}/{sid} left out: {why}" for (v, sid), why in run.left_out.items()]
    warnings = left_out + mismatched + warnings
    thead, trows = _timing_rows(run, timings, [s.id for s in run.samples])
    m = run.manifest
    model = m.get("model") or {}
    doc = {
        "title": f"sagegen report — {model.get('name', run.path.name)}",
        "subtitle": f"{run.path.resolve()} · {run.kind} · {len(run.samples)} sample(s) · "
                    f"created {m.get('created', '?')}",
        "kind": run.kind, "gain": opts.gain, "quality": opts.quality, "rows": rows, "warnings": warnings,
        "links": links,
        "metrics_html": metrics_html,
        "timings_html": (H.table(thead, trows) + _cpu_timing_note(m)) if timings
        else '<p class="muted">No timings in the manifest.</p>',
        "model": model, "settings": m.get("settings") or {},
        "attention": {k: v for k, v in (m.get("attention") or {}).items()},
        "environment": {**(m.get("versions") or {}), "gpu": m.get("gpu")},
        "command": shlex.join(str(x) for x in (m.get("command") or [])),
        "sparse_html": sparse_html(m),
        "cache_html": cache_html(m),
    }
    written["html"] = atomic_write_text(out / "report.html", H.render(doc))
    return written


def _sample_row(run: Run, s: Sample, frames: dict, opts: ReportOptions, mdoc: dict | None, timings: dict,
                out: Path, written: dict) -> dict:
    """One sample's section: players (every ``step``-th frame), per-frame PSNR of every frame, tables, and
    its side-by-side MP4/PNG."""
    video = run.kind == "video"
    base = frames[run.baseline]
    psnr = {c: psnr_frames(frames[c], base) for c in run.candidates}
    n = base.shape[0]
    step = max(1, math.ceil(n / opts.max_frames))
    idx = list(range(0, n, step))

    def view(img):  # an image model has one frame: lossless costs little
        return view_uri(img, opts.quality) if video else data_uri(img, "PNG")

    views = [{"label": _label(run, v), "frames": [view(fit(frames[v][t], opts.max_side)) for t in idx]}
             for v in run.variants]
    for c in run.candidates:  # always lossless: this view is what the caption promises is exact
        views.append({"label": f"|{_label(run, c)} − baseline| × {opts.gain:g}", "diff": True, "frames": [
            data_uri(fit(amplified_diff(frames[c][t], base[t], opts.gain), opts.max_side), "PNG") for t in idx]})
    h, w = fit(base[0], opts.max_side).shape[:2]
    sbs_rel = None
    if opts.mp4:
        p = _write_side_by_side(run, s, frames, out)
        written[f"side_by_side:{s.id}"] = p
        sbs_rel = p.relative_to(out).as_posix()
    mhead = ["metric", H.e(run.baseline)] + [x for c in run.candidates for x in (H.e(c), H.e(f"Δ {c}"))]
    thead, trows = _timing_rows(run, timings, [s.id])
    return {
        "id": s.id, "prompt": s.prompt, "seed": s.seed, "n": len(idx), "step": step, "total": n,
        "fps": run.fps / step, "w": w, "h": h, "views": views, "psnr": psnr,
        "metrics_head": mhead, "metrics": sample_metric_rows(run, mdoc, s.id, psnr),
        "timings_head": thead, "timings": trows if timings else [], "sbs": sbs_rel,
    }


def _write_side_by_side(run: Run, s: Sample, frames: dict, out: Path) -> Path:
    labels = [BASELINE_LABEL] + [_label(run, c) for c in run.candidates]
    base = frames[run.baseline]
    if run.kind == "video":
        return write_side_by_side_mp4(base, [frames[c] for c in run.candidates],
                                      out / "side_by_side" / f"{s.id}.mp4", fps=run.fps, labels=labels)
    import io

    from PIL import Image

    from sagegen.runs.directory import atomic_write_bytes

    from sagegen.report.frames import side_by_side

    buf = io.BytesIO()
    Image.fromarray(side_by_side([base[0]] + [frames[c][0] for c in run.candidates], labels)).save(buf, format="PNG")
    return atomic_write_bytes(out / "side_by_side" / f"{s.id}.png", buf.getvalue())


def _cpu_timing_note(manifest: dict) -> str:
    """Runs without a GPU time sagegen's PyTorch emulation: say so next to the speedups."""
    if manifest.get("gpu"):
        return ""
    return ('<p class="muted">Run without a GPU: sagegen ran its PyTorch emulation of the kernels (correct, not '
            'fast), so these times are not speed measurements.</p>')
