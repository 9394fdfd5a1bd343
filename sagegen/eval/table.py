"""The terminal summary of ``metrics.json``: a rich table, one row per metric."""

from __future__ import annotations

from typing import Iterable

from rich.table import Table

from sagegen.eval.stats import fmt_ci, fmt_counts, fmt_num

DIGITS = {"psnr": 2, "clipscore": 2, "fid": 3, "kid": 5}


def _digits(m: str) -> int:
    return DIGITS.get(m, 4)


def metrics_table(doc: dict, only: Iterable[str] | None = None) -> Table:
    base = doc.get("baseline", "sdpa")
    cands = list(doc.get("candidates") or ["sage"])
    t = Table(title="sagegen eval", show_lines=False)
    t.add_column("metric", style="bold")
    t.add_column(f"{base} (baseline)", justify="right")
    for c in cands:
        t.add_column(c, justify="right")
        t.add_column(f"Δ {c}−{base} [95% CI]", justify="right")
    t.add_column("notes", overflow="fold", max_width=60)
    metrics = doc.get("metrics", {})
    for m in only or metrics:
        e = metrics.get(m)
        if e is None:
            continue
        d = _digits(m)
        arrow = "↑" if e.get("higher_is_better") else "↓"
        name = f"{m} {arrow}" if "higher_is_better" in e else m
        if e.get("status") != "ok":
            t.add_row(name, *(["—"] * (1 + 2 * len(cands))), f"[yellow]{e.get('status')}[/] (reason below)")
            continue
        note = e.get("warning") or e.get("note") or ""
        if e.get("mode"):
            note = f"mode={e['mode']}, model={e.get('model')}" + (f"; {note}" if note else "")
        row = [name]
        if e["kind"] == "paired":
            row.append("(reference)")
            for c in cands:
                row += [fmt_ci(e["aggregate"].get(c), d), "—"]
        elif e["kind"] == "per_variant":
            row.append(fmt_ci(e["aggregate"].get(base), d))
            for c in cands:
                row += [fmt_ci(e["aggregate"].get(c), d), fmt_ci(e.get("delta", {}).get(c), d)]
        else:  # set metrics: one number per pair of sets, no CI
            vr = e.get("vs_reference") or {}
            row.append(f"{fmt_num(vr[base].get('value'), d)} vs ref" if base in vr else "(reference set)")
            for c in cands:
                row += [set_cell(e, c, d, "\n", "vs base"), _ref_delta(e, c, d)]
            note = f"whole set: {fmt_counts(e.get('n'))}, {e.get('extractor')}" + (f"; {note}" if note else "")
        row.append(note)
        t.add_row(*row)
    return t


def set_cell(e: dict, c: str, d: int, newline: str, vs_base: str) -> str:
    """FID/KID cell of candidate ``c``: value (± std over KID subsets, when there are several) vs the
    baseline set, and vs the reference set when there is one."""
    v = (e.get("vs_baseline") or {}).get(c) or {}
    std = fmt_num(v.get("std"), d)
    cell = fmt_num(v.get("value"), d) + (f" ± {std}" if std != "—" else "") + f" {vs_base}"
    vr = (e.get("vs_reference") or {}).get(c)
    if vr:
        cell += f"{newline}{fmt_num(vr.get('value'), d)} vs ref"
    return cell


def _ref_delta(e: dict, c: str, d: int) -> str:
    dl = (e.get("delta_vs_reference") or {}).get(c)
    return f"{fmt_num(dl.get('value'), d, sign=True)} vs ref" if dl else "—"


def skip_lines(doc: dict, only: Iterable[str] | None = None) -> list[str]:
    """One line per reason a metric did not run: ``<metric>[, <metric>] skipped: <reason>``."""
    metrics = doc.get("metrics", {})
    groups: dict[tuple[str, str], list[str]] = {}
    for m in only or metrics:
        e = metrics.get(m) or {}
        if e.get("status") in ("skipped", "error"):
            groups.setdefault((e["status"], e.get("reason", "")), []).append(m)
    return [f"{', '.join(ms)} {status}: {reason}" for (status, reason), ms in groups.items()]


def against_table(entry: dict, metrics: Iterable[str], other: str) -> Table:
    """One row per pair of variants (``here~there``), one column per paired metric (`sagegen.eval.against`)."""
    t = Table(title=f"sagegen eval --against {other}", show_lines=False)
    t.add_column("here ~ there", style="bold")
    metrics = [m for m in metrics if m in entry.get("metrics", {})]
    for m in metrics:
        t.add_column(f"{m} [95% CI]", justify="right")
    pairs = list(next(iter(entry["metrics"].values()))["aggregate"]) if metrics else []
    for p in pairs:
        t.add_row(p, *(fmt_ci(entry["metrics"][m]["aggregate"].get(p), _digits(m)) for m in metrics))
    return t
