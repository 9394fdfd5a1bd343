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
from sagegen.eval.rundata import Run, load_frames, load_run
from sagegen.eval.stats import fmt_ci
from sagegen.rundir import atomic_write_text

from . import html as H
from .contact import write_contact_sheet
from .frames import BASELINE_LABEL, CANDIDATE_LABEL, DIFF_GAIN, amplified_diff, data_uri, fit
from .video import write_side_by_side_mp4

TIMING_KEYS = ("total_s", "denoise_s", "decode_s")
DIGITS = {"psnr": 2, "clipscore": 2, "fid": 3, "kid": 5}


@dataclass
class ReportOptions:
    max_side: int = 384  # longest side of the frames embedded in the HTML
    max_frames: int = 64  # frames per player; longer clips show every k-th frame
    gain: float = DIFF_GAIN
    quality: int = 85  # JPEG quality of embedded video frames
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


def _summary_metrics(run: Run, mdoc: dict | None) -> tuple[str, list[str]]:
    warnings: list[str] = []
    if not mdoc:
        return '<p class="muted">No metrics.json yet: run <code>sagegen eval RUN_DIR --metric all</code>.</p>', warnings
    head = ["metric", H.e(f"{run.baseline} (baseline)")]
    for c in run.candidates:
        head += [H.e(c), H.e(f"Δ {c} − {run.baseline}")]
    head.append("notes")
    rows = []
    for m, ent in (mdoc.get("metrics") or {}).items():
        d = DIGITS.get(m, 4)
        if ent.get("status") != "ok":
            continue
        hib = ent.get("higher_is_better")
        name = f"{H.e(m)} {'↑' if hib else '↓'}"
        notes = []
        if ent.get("mode"):
            notes.append(f"mode={ent['mode']}, model={ent.get('model')}")
        for k in ("note", "warning"):
            if ent.get(k):
                notes.append(ent[k])
        row = [name]
        if ent["kind"] == "paired":
            row.append('<span class="muted">reference</span>')
            for c in run.candidates:
                row += [H.e(fmt_ci(ent["aggregate"].get(c), d)), "—"]
        elif ent["kind"] == "per_variant":
            row.append(H.e(fmt_ci(ent["aggregate"].get(run.baseline), d)))
            for c in run.candidates:
                dl = (ent.get("delta") or {}).get(c) or {}
                row += [H.e(fmt_ci(ent["aggregate"].get(c), d)), H.signed(dl.get("mean"), d, hib, dl.get("ci"))]
        else:
            vr = ent.get("vs_reference") or {}
            row.append(f"{vr[run.baseline]['value']:.{d}f} vs ref" if run.baseline in vr else '<span class="muted">reference set</span>')
            for c in run.candidates:
                vb = ent["vs_baseline"][c]
                cell = f"{vb['value']:.{d}f}" + (f" ± {vb['std']:.{d}f}" if "std" in vb else "") + " vs baseline"
                if c in vr:
                    cell += f"<br>{vr[c]['value']:.{d}f} vs ref"
                dl = (ent.get("delta_vs_reference") or {}).get(c)
                row += [cell, H.signed(dl["value"], d, hib) + " vs ref" if dl else "—"]
            notes.append(f"n={ent.get('n')}, {ent.get('extractor')}")
        row.append(f'<span class="muted">{H.e("; ".join(notes))}</span>')
        rows.append(row)
    from sagegen.eval.table import skip_lines

    warnings.extend(skip_lines(mdoc))
    html = H.table(head, rows) if rows else '<p class="muted">No metric computed.</p>'
    return html, warnings


def _sample_metric_rows(run: Run, mdoc: dict | None, sid: str, psnr: dict[str, list[float]]) -> list[list[str]]:
    rows = []
    metrics = (mdoc or {}).get("metrics") or {}
    if "psnr" not in metrics or metrics["psnr"].get("status") != "ok":  # the report computes PSNR itself
        row = ["psnr ↑ (dB)", "—"]
        for c in run.candidates:
            row += [f"{float(np.mean(psnr[c])):.2f}", "—"]
        rows.append(row)
    for m, ent in metrics.items():
        if ent.get("status") != "ok" or ent.get("kind") == "set":
            continue
        d = DIGITS.get(m, 4)
        per = ent.get("per_sample") or {}
        name = f"{m} {'↑' if ent.get('higher_is_better') else '↓'}"
        if ent["kind"] == "paired":
            row = [name, "—"]
            for c in run.candidates:
                v = (per.get(c) or {}).get(sid, {}).get("value")
                row += [H._fmt(v, d), "—"]
        else:
            b = (per.get(run.baseline) or {}).get(sid, {}).get("value")
            row = [name, H._fmt(b, d)]
            for c in run.candidates:
                v = (per.get(c) or {}).get(sid, {}).get("value")
                row += [H._fmt(v, d), H.signed(v - b, d, ent.get("higher_is_better")) if v is not None and b is not None else "—"]
        rows.append(row)
    return rows


def build_report(
    run_dir: str | Path, opts: ReportOptions | None = None, log: Callable[[str], None] = print
) -> dict[str, Path]:
    opts = opts or ReportOptions()
    run = load_run(run_dir, log=log)
    out = run.path / "report"
    out.mkdir(parents=True, exist_ok=True)
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
    for i, s in enumerate(run.samples):
        log(f"  [{i + 1}/{len(run.samples)}] {s.id}")
        frames = {v: load_frames(s.frame_paths(v)) for v in run.variants}
        base = frames[run.baseline]
        for c in run.candidates:
            if frames[c].shape != base.shape:
                raise ValueError(f"sample {s.id}: {c} frames {frames[c].shape} differ from baseline {base.shape}")
        psnr = {c: psnr_frames(frames[c], base) for c in run.candidates}
        n = base.shape[0]
        step = max(1, math.ceil(n / opts.max_frames))
        idx = list(range(0, n, step))
        fmt = "JPEG" if video else "PNG"
        views = []
        for v in run.variants:
            views.append({"label": _label(run, v),
                          "frames": [data_uri(fit(frames[v][t], opts.max_side), fmt, opts.quality) for t in idx]})
        for c in run.candidates:
            lbl = f"|{_label(run, c)} − baseline| × {opts.gain:g}"
            views.append({"label": lbl, "diff": True, "frames": [
                data_uri(fit(amplified_diff(frames[c][t], base[t], opts.gain), opts.max_side), fmt, opts.quality)
                for t in idx]})
        h, w = fit(base[0], opts.max_side).shape[:2]
        sbs_rel = None
        if opts.mp4:
            if video:
                p = write_side_by_side_mp4(base, [frames[c] for c in run.candidates],
                                           out / "side_by_side" / f"{s.id}.mp4", fps=run.fps,
                                           labels=[BASELINE_LABEL] + [_label(run, c) for c in run.candidates])
            else:
                from .frames import side_by_side
                from .contact import Image  # PIL, already imported there
                import io

                im = side_by_side([base[0]] + [frames[c][0] for c in run.candidates],
                                  [BASELINE_LABEL] + [_label(run, c) for c in run.candidates])
                buf = io.BytesIO()
                Image.fromarray(im).save(buf, format="PNG")
                from sagegen.rundir import atomic_write_bytes

                p = atomic_write_bytes(out / "side_by_side" / f"{s.id}.png", buf.getvalue())
            written[f"side_by_side:{s.id}"] = p
            sbs_rel = p.relative_to(out).as_posix()
        mhead = ["metric", H.e(run.baseline)] + [x for c in run.candidates for x in (H.e(c), H.e(f"Δ {c}"))]
        thead, trows = _timing_rows(run, timings, [s.id])
        rows.append({
            "id": s.id, "prompt": s.prompt, "seed": s.seed, "n": len(idx), "step": step, "fps": run.fps / step,
            "w": w, "h": h, "views": views, "psnr": {c: [psnr[c][t] for t in idx] for c in run.candidates},
            "metrics_head": mhead, "metrics": _sample_metric_rows(run, mdoc, s.id, psnr),
            "timings_head": thead, "timings": trows if timings else [], "sbs": sbs_rel,
        })
        if len(sheet_rows) < opts.contact_prompts:
            sheet_rows.append((s.prompt, base, frames[run.candidates[0]]))
    links = [(f"side-by-side {'MP4' if video else 'PNG'}s", "side_by_side/")] if opts.mp4 else []
    if opts.contact:
        model_name = (run.manifest.get("model") or {}).get("name", "")
        written["contact_sheet"] = write_contact_sheet(
            out / "contact_sheet.png", sheet_rows, gain=opts.gain,
            title=f"sagegen: {model_name} — baseline vs sagegen")
        links.append(("contact sheet (PNG)", "contact_sheet.png"))
    metrics_html, warnings = _summary_metrics(run, mdoc)
    thead, trows = _timing_rows(run, timings, [s.id for s in run.samples])
    m = run.manifest
    model = m.get("model") or {}
    doc = {
        "title": f"sagegen report — {model.get('name', run.path.name)}",
        "subtitle": f"{run.path.resolve()} · {run.kind} · {len(run.samples)} sample(s) · created {m.get('created', '?')}",
        "kind": run.kind, "gain": opts.gain, "rows": rows, "warnings": warnings, "links": links,
        "metrics_html": metrics_html,
        "timings_html": (H.table(thead, trows) + _cpu_timing_note(m)) if timings
        else '<p class="muted">No timings in the manifest.</p>',
        "model": model, "settings": m.get("settings") or {},
        "attention": {k: v for k, v in (m.get("attention") or {}).items()},
        "environment": {**(m.get("versions") or {}), "gpu": m.get("gpu")},
        "command": shlex.join(str(x) for x in (m.get("command") or [])),
    }
    written["html"] = atomic_write_text(out / "report.html", H.render(doc))
    return written


def _cpu_timing_note(manifest: dict) -> str:
    """Runs without a GPU time sagegen's PyTorch emulation: say so next to the speedups."""
    if manifest.get("gpu"):
        return ""
    return ('<p class="muted">Run without a GPU: sagegen ran its PyTorch emulation of the kernels (correct, not '
            'fast), so these times are not speed measurements.</p>')
