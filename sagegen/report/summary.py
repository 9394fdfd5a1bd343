"""The metric tables of report.html, from metrics.json: the summary over the run and one table per sample.

Per-sample metrics (CLIP, PSNR, SSIM, LPIPS) are means over samples with a Student-t CI
(over prompts when prompts have several seeds); FID/KID are one
number for the whole set of frames. Each row says which it is, with the settings stored in its own entry
(samples, resamples), because metrics.json can hold metrics computed by different ``sagegen eval`` calls.
"""

from __future__ import annotations

import shlex

import numpy as np

from sagegen.runs.reader import Run
from sagegen.eval.stats import fmt_ci, fmt_counts
from sagegen.eval.table import set_cell, skip_lines

from sagegen.report import html as H

DIGITS = {"psnr": 2, "clipscore": 2, "fid": 3, "kid": 5}
EXPLAIN = ('<p class="muted">Per-sample metrics: mean over samples, with a Student-t confidence interval '
           "(samples that share a prompt count as one unit). FID and KID: one value for the whole set of frames, "
           "so no interval (KID ± its std over random subsets, where there is more than one subset).</p>")


def _interval_note(ent: dict) -> str:
    iv = ent.get("interval")
    if iv is None:  # metrics.json written before the Student-t intervals
        return _bootstrap_note(ent)
    n = ent.get("n_samples")
    over = " over prompts" if iv.get("over") == "prompts" else ""
    return f"mean over {n} sample(s), {iv.get('level', 0.95):.0%} Student-t CI{over}"


def _bootstrap_note(ent: dict) -> str:
    boot = ent.get("bootstrap") or {}
    n = ent.get("n_samples")
    if n is None:  # metrics.json from before per-metric settings: the aggregate knows its n
        n = max((a.get("n", 0) for a in (ent.get("aggregate") or {}).values()), default=0)
    level = boot.get("level", 0.95)
    how = f", {boot['n_boot']} resamples" if boot.get("n_boot") else ""
    return f"mean over {n} sample(s), {level:.0%} bootstrap CI{how}"


def _set_notes(ent: dict) -> list[str]:
    notes = [f"one value for the whole set: {fmt_counts(ent.get('n'))}", str(ent.get("extractor"))]
    if ent.get("comparable_to_published") is not True:
        notes.append("comparable to published FIDs: " + ("no" if ent.get("comparable_to_published") is False
                                                           else "unverified"))
    return notes


def summary_metrics(run: Run, mdoc: dict | None) -> tuple[str, list[str]]:
    """(HTML of the summary table, lines for metrics that were skipped or failed)."""
    if not mdoc:
        typed = H.e(shlex.quote(str(run.path)))  # a path with spaces still works when pasted
        return f'<p class="muted">No metrics.json yet: run <code>sagegen eval {typed}</code>.</p>', []
    head = ["metric", H.e(f"{run.baseline} (baseline)")]
    for c in run.candidates:
        head += [H.e(c), H.e(f"Δ {c} − {run.baseline}")]
    head.append("notes")
    rows = []
    for m, ent in (mdoc.get("metrics") or {}).items():
        if ent.get("status") != "ok":
            continue
        d = DIGITS.get(m, 4)
        hib = ent.get("higher_is_better")
        notes = []
        if ent.get("mode"):
            notes.append(f"mode={ent['mode']}, model={ent.get('model')}")
        row = [f"{H.e(m)} {'↑' if hib else '↓'}"]
        if ent["kind"] == "paired":
            row.append('<span class="muted">reference</span>')
            for c in run.candidates:
                row += [H.e(fmt_ci(ent["aggregate"].get(c), d)), "—"]
            notes.insert(0, _interval_note(ent))
        elif ent["kind"] == "per_variant":
            row.append(H.e(fmt_ci(ent["aggregate"].get(run.baseline), d)))
            for c in run.candidates:
                dl = (ent.get("delta") or {}).get(c) or {}
                row += [H.e(fmt_ci(ent["aggregate"].get(c), d)), H.signed(dl.get("mean"), d, hib, dl.get("ci"))]
            notes.insert(0, _interval_note(ent))
        else:
            vr = (ent.get("vs_reference") or {}).get(run.baseline)
            row.append(f"{H._fmt(vr.get('value'), d)} vs ref" if vr else '<span class="muted">reference set</span>')
            for c in run.candidates:
                dl = (ent.get("delta_vs_reference") or {}).get(c)
                ref = H.signed(dl.get("value"), d, hib) + " vs ref" if dl else "—"
                row += [set_cell(ent, c, d, "<br>", "vs baseline"), ref]
            notes = _set_notes(ent) + notes
        notes += [ent[k] for k in ("note", "warning") if ent.get(k)]
        row.append(f'<span class="muted">{H.e("; ".join(notes))}</span>')
        rows.append(row)
    html = (H.table(head, rows) + EXPLAIN) if rows else '<p class="muted">No metric computed.</p>'
    return html + against_tables(mdoc), skip_lines(mdoc)


def against_tables(mdoc: dict) -> str:
    """One table per ``sagegen eval --against OTHER`` (metrics.json's ``against``): a row per pair of variants."""
    parts = []
    for name, entry in (mdoc.get("against") or {}).items():
        metrics = list(entry.get("metrics") or {})
        if not metrics:
            continue
        pairs = list(entry["metrics"][metrics[0]].get("aggregate") or {})
        head = ["here ~ there"] + [f"{H.e(m)} {'↓' if m == 'lpips' else '↑'}" for m in metrics]
        rows = [[H.e(p)] + [H.e(fmt_ci(entry["metrics"][m]["aggregate"].get(p), DIGITS.get(m, 4))) for m in metrics]
                for p in pairs]
        n = len(entry.get("samples") or [])
        parts.append(f"<h3>Against {H.e(name)}</h3>"
                     f'<p class="muted">Each variant of this run against each variant of {H.e(entry.get("run_dir"))}'
                     f" (same prompts and seeds), over {n} sample(s): "
                     f"<code>sagegen eval RUN --against OTHER</code>.</p>" + H.table(head, rows))
    return "".join(parts)


def sample_metric_rows(run: Run, mdoc: dict | None, sid: str, psnr: dict[str, list[float]]) -> list[list[str]]:
    """One sample's per-sample metrics (set metrics have no per-sample value)."""
    rows = []
    metrics = (mdoc or {}).get("metrics") or {}
    if "psnr" not in metrics or metrics["psnr"].get("status") != "ok":  # the report computes PSNR itself
        row = ["psnr ↑ (dB)", "—"]
        for c in run.candidates:
            row += [H._fmt(float(np.mean(psnr[c])), 2) if psnr.get(c) else "—", "—"]
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
                row += [H._fmt(v, d),
                        H.signed(v - b, d, ent.get("higher_is_better")) if v is not None and b is not None else "—"]
        rows.append(row)
    return rows
