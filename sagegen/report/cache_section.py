"""The report's step-cache section: what a run's ``--cache`` computed per denoiser call, per variant
(``setup.<variant>.<rank>.cache`` in the manifest, written by `generate.step_cache`)."""

from __future__ import annotations

from html import escape as e

from sagegen.report import html as H


def cache_html(manifest: dict) -> str:
    """HTML for every variant/rank that ran with a step cache; "" when none did."""
    parts = []
    for variant, rank, cache in H.setup_entries(manifest, "cache"):
        spec, sched = cache.get("spec") or {}, cache.get("schedule") or {}
        name = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "kind")
        head = (f"<h3>{e(variant)} ({e(rank)}): {e(str(spec.get('kind')))} ({e(name)}), block work "
                f"{e(H.percent(sched.get('block_work')))}, attention work "
                f"{e(H.percent(sched.get('attention_work')))}"
                "</h3>")
        blocks, attention = sched.get("blocks") or [], sched.get("attention") or []
        per_block, per_attn = sched.get("blocks_per_call") or 0, sched.get("attention_per_call") or 0
        rows = [[f"blocks computed (of {per_block})"] + [str(b) for b in blocks],
                [f"attention modules computed (of {per_attn})"] + [str(a) for a in attention]]
        note = ('<p class="muted">Per denoiser call, in order (with guidance in two calls, two per step): the '
                'main blocks and attention modules that ran their own forward; the cache answered the rest. '
                'On random weights only fixed schedules (TaylorSeer, PAB) skip as they would on real ones. '
                'Quality against an uncached run: <code>sagegen eval</code>.</p>')
        parts.append(head + H.table(["call"] + [str(i) for i in range(len(blocks))], rows, raw=False) + note
                     + _cachedit_html(sched.get("cachedit")))
    if not parts:
        return ""
    return "<section><h2>Step cache</h2>" + "".join(parts) + "</section>"



def _cachedit_html(contexts: list | None) -> str:
    """cache-dit's own record (``schedule.cachedit``): the steps of the last generation it served from its cache."""
    if not contexts:
        return ""
    items = []
    for c in contexts:
        text = f"steps {c.get('cached_steps')}"
        if c.get("cfg_cached_steps"):
            text += f", unconditional calls: steps {c.get('cfg_cached_steps')}"
        items.append(text)
    return ('<p class="muted">cache-dit\'s cached steps (0-based, the last generation): ' + e("; ".join(items))
            + "</p>")
