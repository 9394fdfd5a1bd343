"""The report's block-sparse section: the realized attention density per step and layer of a sparse run
(``setup.<variant>.<rank>.sparse`` in the manifest, written by `generate.attention`)."""

from __future__ import annotations

from html import escape as e

from sagegen.report import html as H


def sparse_html(manifest: dict) -> str:
    """HTML for every variant/rank that ran sparse; "" when none did."""
    parts = []
    for variant, rank, sp in H.setup_entries(manifest, "sparse"):
        cfg, dens = sp.get("config") or {}, sp.get("density") or {}
        head = (f"<h3>{e(variant)} ({e(rank)}): mode {e(str(cfg.get('mode')))}, value "
                f"{e(str(cfg.get('value')))}, overall density {e(H.percent(dens.get('overall')))}</h3>")
        rows = dens.get("per_step_layer") or []
        steps = sorted({r["step"] for r in rows})
        layers = sorted({r["layer"] for r in rows})
        cell = {(r["layer"], r["step"]): r["density"] for r in rows}
        table_rows = [["all sparse layers"] + [H.percent((dens.get("per_step") or {}).get(str(s))) for s in steps]]
        table_rows += [[layer] + [H.percent(cell.get((layer, s))) for s in steps] for layer in layers]
        note = ('<p class="muted">Fraction of attention blocks computed (1 = dense). Steps and layers not '
                'listed ran dense (policy: first steps, dense blocks, cross-attention, short calls). Quality '
                'against the dense run: <code>sagegen eval</code> (see docs/sparse.md).</p>')
        parts.append(head + H.table(["layer \\ step"] + [str(s) for s in steps], table_rows, raw=False) + note)
    if not parts:
        return ""
    return "<section><h2>Block-sparse attention</h2>" + "".join(parts) + "</section>"

