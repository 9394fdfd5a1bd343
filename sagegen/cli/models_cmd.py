"""``sagegen models``: the presets, their hub ids and defaults, and whether their weights are local."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from sagegen.cli.errors import cli_command


def preset_rows() -> list[dict]:
    from sagegen.models.loading import weights_status
    from sagegen.models.presets import PRESETS

    rows = []
    for p in PRESETS.values():
        rows.append({"name": p.name, "family": p.family, "kind": p.kind, "hub_id": p.hub_id,
                     "aliases": list(p.aliases), **p.defaults(), "gated": p.gated, "weights": weights_status(p),
                     "source": p.source, "notes": p.notes})
    return rows


@cli_command
def models_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also show where each default comes from.")] = False,
) -> None:
    """List the model presets: hub ids, recommended defaults, local weights.

    Weights: "built-in" (tiny models), "cached" (Hugging Face cache), "partial" or "not downloaded".

    Examples: sagegen models; sagegen models --verbose; sagegen models --json
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from sagegen.models.loading import hf_cache_dir

    rows = preset_rows()
    console = Console(highlight=False, soft_wrap=as_json)
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table(title="sagegen model presets", title_justify="left",
                  caption=f"Hugging Face cache: {hf_cache_dir()}", caption_justify="left")
    for col in ("name", "hub id", "size", "frames@fps", "steps", "guidance", "dtype", "weights"):
        table.add_column(col, justify="right" if col in ("steps", "guidance") else "left", no_wrap=True)
    style = {"built-in": "cyan", "cached": "green", "partial": "yellow", "not downloaded": "dim"}
    for r in rows:
        weights = r["weights"] + (" (gated)" if r["gated"] and r["weights"] != "cached" else "")
        table.add_row(r["name"], r["hub_id"] or "—", f"{r['width']}x{r['height']}",
                      f"{r['frames']}@{r['fps']}" if r["frames"] else "image", str(r["steps"]), f"{r['guidance']:g}",
                      r["dtype"], f"[{style.get(r['weights'], '')}]{weights}[/]")
    if not console.is_terminal:  # piped or logged: whole cells, however wide (a terminal keeps its width)
        console.width = max(console.width, console.measure(table, options=console.options.update_width(1000)).maximum)
    console.print(table)
    aliases = ", ".join(f"{a} → {r['name']}" for r in rows for a in r["aliases"] if "/" not in a)
    console.print(f"aliases: {aliases}", style="dim", markup=False)
    if verbose:
        for r in rows:
            console.print(f"[bold]{escape(r['name'])}[/]: {escape(str(r['source']))}"
                          + (f" — {escape(r['notes'])}" if r["notes"] else ""))
    console.print("Get weights: hf download <hub id> (gated: accept the licence on the hub and `hf auth login` "
                  "first), or pass --model-path DIR; --random-weights needs none.", style="dim", markup=False)


def register(app: typer.Typer) -> None:
    app.command("models")(models_command)
