"""The report's block-sparse section: the realized attention density per step and layer of a sparse run
(``setup.<variant>.<rank>.sparse`` in the manifest, written by `generate.attention`)."""

from __future__ import annotations

from html import escape as e

from sagegen.report import html as H


def sparse_html(manifest: dict) -> str:
    """HTML for every variant/rank that ran sparse; "" when none did."""
    parts = []
    for variant, ranks in sorted((manifest.get("setup") or {}).items()):
        for rank, setup in sorted((ranks or {}).items()):
            sp = (setup or {}).get("sparse") if isinstance(setup, dict) else None
            if not sp:
                continue
            cfg, dens = sp.get("config") or {}, sp.get("density") or {}
            head = (f"<h3>{e(variant)} ({e(rank)}): mode {e(str(cfg.get('mode')))}, value "
                    f"{e(str(cfg.get('value')))}, overall density {e(_pct(dens.get('overall')))}</h3>")
            rows = dens.get("per_step_layer") or []
            steps = sorted({r["step"] for r in rows})
            layers = sorted({r["layer"] for r in rows})
            cell = {(r["layer"], r["step"]): r["density"] for r in rows}
            table_rows = [["all sparse layers"] + [_pct((dens.get("per_step") or {}).get(str(s))) for s in steps]]
            table_rows += [[layer] + [_pct(cell.get((layer, s))) for s in steps] for layer in layers]
            note = ('<p class="muted">Fraction of attention blocks computed (1 = dense). Steps and layers not '
                    'listed ran dense (policy: first steps, dense blocks, cross-attention, short calls). Quality '
                    'against the dense run: <code>sagegen eval</code> (see docs/sparse.md).</p>')
            parts.append(head + H.table(["layer \\ step"] + [str(s) for s in steps], table_rows, raw=False) + note)
    if not parts:
        return ""
    return "<section><h2>Block-sparse attention</h2>" + "".join(parts) + "</section>"


def _pct(v) -> str:
    return "–" if v is None else f"{100 * float(v):.1f}%"
