"""report.html: one self-contained page (inline CSS, JS, images) that opens from disk."""

from __future__ import annotations

import html
import json
import math
from typing import Any

from sagegen.eval.stats import fmt_num

from sagegen.report.assets import CSS, JS

e = html.escape


def _fmt(v: Any, d: int = 4) -> str:
    if v is None or isinstance(v, float):
        return fmt_num(v, d)  # None/NaN (null in metrics.json) -> "—"
    return e(str(v))


def ordinal(k: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st, 22nd."""
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def kv_table(d: dict, skip: tuple = ()) -> str:
    rows = []
    for k, v in d.items():
        if k in skip:
            continue
        if isinstance(v, (dict, list)):
            v = json.dumps(v, sort_keys=True)
        rows.append(f"<tr><td>{e(str(k))}</td><td>{e(str(v))}</td></tr>")
    return f'<table class="kv">{"".join(rows)}</table>' if rows else '<p class="muted">—</p>'


def table(head: list[str], rows: list[list[str]], raw: bool = True) -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def signed(v: float | None, d: int, higher_is_better: bool | None, ci: list | None = None) -> str:
    if fmt_num(v) == "—":
        return "—"
    cls = ""
    if higher_is_better is not None and ci and len(ci) == 2 and not (ci[0] <= 0 <= ci[1]):
        cls = "good" if (v > 0) == higher_is_better else "bad"
    s = f"{v:+.{d}f}"
    if ci and len(ci) == 2 and not math.isclose(ci[0], ci[1]):
        s += f' <span class="muted">[{ci[0]:+.{d}f}, {ci[1]:+.{d}f}]</span>'
    return f'<span class="{cls}">{s}</span>' if cls else s


def psnr_svg(series: dict[str, list[float]], sid: str, step: int = 1, width: int = 520, height: int = 150) -> str:
    """Per-frame PSNR of every frame (x = real frame number), one polyline per candidate, with a cursor line
    the player moves; the player shows every ``step``-th frame, so its frame k sits at real frame k·step."""
    vals = [v for s in series.values() for v in s if v is not None]
    if not vals:
        return ""
    n = max(len(s) for s in series.values())
    lo, hi = min(vals), max(vals)
    if hi - lo < 1e-6:
        lo, hi = lo - 1, hi + 1
    pad = (hi - lo) * 0.1
    lo, hi = lo - pad, hi + pad
    ml, mr, mt, mb = 44, 10, 10, 24
    pw, ph = width - ml - mr, height - mt - mb
    dx = pw / max(n - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return ml + i * dx, mt + ph * (1 - (v - lo) / (hi - lo))

    colors = ["#0b57d0", "#c62828", "#1a7f37", "#8e24aa"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="per-frame PSNR">']
    for frac in (0.0, 0.5, 1.0):
        v = lo + (hi - lo) * frac
        y = mt + ph * (1 - frac)
        parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        dd = 1 if hi - lo > 3 else 2 if hi - lo > 0.3 else 3
        parts.append(f'<text x="{ml - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end" fill="#666">'
                     f'{v:.{dd}f}</text>')
    parts.append(f'<text x="{ml + pw / 2:.1f}" y="{height - 6}" font-size="10" text-anchor="middle" fill="#666">'
                 f'frame (1–{n}) · PSNR dB vs baseline</text>')
    for k, (name, s) in enumerate(series.items()):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(s) if v is not None))
        c = colors[k % len(colors)]
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.6" points="{pts}">'
                     f'<title>{e(name)}</title></polyline>')
        for i, v in enumerate(s):
            x, y = xy(i, v)
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{c}">'
                         f'<title>frame {i + 1}: {v:.2f} dB</title></circle>')
    parts.append(f'<line class="sg-cursor" data-id="{e(sid)}" data-x0="{ml}" data-dx="{dx:.4f}" data-step="{step}" '
                 f'x1="{ml}" x2="{ml}" '
                 f'y1="{mt}" y2="{mt + ph}" stroke="#888" stroke-dasharray="3,3"/>')
    parts.append("</svg>")
    return "".join(parts)


def _css_size(row: dict, min_w: int = 256) -> str:
    w, h = row["w"], row["h"]
    k = max(1, -(-min_w // w)) if w < min_w else 1
    pix = ";image-rendering:pixelated" if k > 1 else ""
    return f'style="width:{w * k}px;height:{h * k}px{pix}"'


def player_html(row: dict) -> str:
    """Canvases for each view (baseline, candidates, diffs) driven by one shared clock."""
    sid = e(row["id"])
    views = "".join(
        f'<div class="view"><div class="lbl">{e(v["label"])}</div>'
        f'<canvas class="sg-view{" sg-diff" if v.get("diff") else ""}" width="{row["w"]}" height="{row["h"]}" '
        f'{_css_size(row)} data-view="{e(v["label"])}"></canvas></div>'
        for v in row["views"]
    )
    note = f' <span class="muted">(every {ordinal(row["step"])} frame)</span>' if row.get("step", 1) > 1 else ""
    return (
        f'<div class="player" id="player-{sid}"><div class="views">{views}</div>'
        f'<div class="controls"><button class="sg-play" type="button">Play</button>'
        f'<input class="sg-seek" type="range" min="0" max="{row["n"] - 1}" value="0" step="1" aria-label="seek">'
        f'<span class="fc">frame 1 / {row.get("total", row["n"])}</span>{note}'
        f'<label class="muted">diff gain <input class="sg-gain" type="range" min="1" max="16" value="1" step="1" '
        f'aria-label="extra difference gain"> <span class="sg-gain-val">×1</span></label></div></div>'
    )


def still_html(row: dict) -> str:
    views = "".join(
        f'<div class="view"><div class="lbl">{e(v["label"])}</div>'
        f'<img src="{v["frames"][0]}" width="{row["w"]}" height="{row["h"]}" {_css_size(row)} '
        f'alt="{e(v["label"])}"></div>'
        for v in row["views"]
    )
    return f'<div class="views">{views}</div>'


def row_html(row: dict, video: bool) -> str:
    parts = [f'<section class="sample" id="sample-{e(row["id"])}"><div class="row-head">'
             f'<div><span class="prompt">{e(row["prompt"])}</span></div>'
             f'<div class="muted">{e(row["id"])} · seed {e(str(row.get("seed")))}'
             + (f' · <a href="{e(row["sbs"])}">side-by-side {"MP4" if video else "PNG"}</a>' if row.get("sbs") else "")
             + "</div></div>"]
    if row.get("error"):
        parts.append(f'<div class="warn">{e(row["error"])}</div></section>')
        return "".join(parts)
    parts.append(player_html(row) if video else still_html(row))
    parts.append('<div class="grid">')
    if row.get("metrics"):
        parts.append("<div><h3>Metrics</h3>" + table(row["metrics_head"], row["metrics"]) + "</div>")
    if row.get("timings"):
        parts.append("<div><h3>Timings</h3>" + table(row["timings_head"], row["timings"]) + "</div>")
    if video and row.get("psnr"):
        parts.append('<div class="plot"><h3>PSNR per frame</h3>' + psnr_svg(row["psnr"], row["id"], row.get("step", 1))
                     + "</div>")
    parts.append("</div></section>")
    return "".join(parts)


def render(doc: dict) -> str:
    """``doc``: the report model built by :mod:`sagegen.report.builder`."""
    video = doc["kind"] == "video"
    shown = [r for r in doc["rows"] if r.get("views")]  # a sample whose frames differ has no player
    players = [{"id": r["id"], "n": r["n"], "fps": r["fps"], "step": r.get("step", 1), "total": r.get("total", r["n"]),
                "views": [v["frames"] for v in r["views"]]} for r in shown] if video else []
    data = json.dumps({"players": players}, separators=(",", ":")).replace("</", "<\\/")
    warn = "".join(f'<div class="warn">{e(w)}</div>' for w in doc.get("warnings", []))
    if warn:
        warn = (f'<details class="skipped"><summary>{len(doc["warnings"])} note(s) on samples or metrics that did '
                f'not run</summary>{warn}</details>')
    links = " · ".join(f'<a href="{e(h)}">{e(t)}</a>' for t, h in doc.get("links", []))
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        f"<title>{e(doc['title'])}</title><style>{CSS}</style></head><body>",
        f"<header><h1>{e(doc['title'])}</h1><div class=\"sub\">{e(doc['subtitle'])}</div></header><main>",
        f'<section><h2>Summary</h2>{warn}<div class="grid">'
        f'<div><h3>Metrics</h3>{doc["metrics_html"]}</div>'
        f'<div><h3>Timings (mean seconds per sample)</h3>{doc["timings_html"]}</div></div>'
        + (f'<p>{links}</p>' if links else "") + "</section>",
    ]
    if video and shown:
        body.append('<p><button id="sg-play-all" type="button">Play all</button> '
                    f'<span class="muted">Players: {" | ".join(e(v["label"]) for v in shown[0]["views"])}; '
                    f'the difference view is |sagegen − baseline| × {doc["gain"]:g} on the lossless frames, '
                    f'embedded losslessly (PNG); the other views are PNG, or JPEG quality {doc.get("quality", 95)} '
                    'with full chroma where PNG would be much larger.</span></p>')
    else:
        body.append(f'<p class="muted">Difference view: |sagegen − baseline| × {doc["gain"]:g} on the lossless '
                    'images.</p>')
    body.extend(row_html(r, video) for r in doc["rows"])
    body.append(doc.get("sparse_html", ""))  # block-sparse density per step and layer, when the run used it
    body.append(doc.get("cache_html", ""))  # what a step cache computed per denoiser call, when the run used one
    body.append('<section><h2>Run settings</h2><div class="grid">'
                f'<div><h3>Model</h3>{kv_table(doc["model"])}</div>'
                f'<div><h3>Settings</h3>{kv_table(doc["settings"])}</div>'
                f'<div><h3>Attention</h3>{kv_table(doc["attention"])}</div>'
                f'<div><h3>Environment</h3>{kv_table(doc["environment"])}</div></div>'
                f'<details><summary>command</summary><pre>{e(doc["command"])}</pre></details></section>')
    body.append(f'</main><script type="application/json" id="sg-data">{data}</script>'
                f'<script>{JS}</script></body></html>')
    return "\n".join(body)


def percent(v) -> str:
    """A fraction as a percentage with one decimal; "–" for None."""
    return "–" if v is None else f"{100 * float(v):.1f}%"


def setup_entries(manifest: dict, key: str):
    """(variant, rank, value) for every ``setup.<variant>.<rank>.<key>`` of a manifest that has one, sorted."""
    for variant, ranks in sorted((manifest.get("setup") or {}).items()):
        for rank, setup in sorted((ranks or {}).items()):
            value = setup.get(key) if isinstance(setup, dict) else None
            if value:
                yield variant, rank, value
