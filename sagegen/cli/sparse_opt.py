"""The ``--sparse SPEC`` option of `run` and `compare` (block-sparse attention for the sagegen variant).

Parsed here, before any model loads: a bad value is a usage error (exit 2) naming the option.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from sagegen.cli.errors import UsageProblem

Sparse = Annotated[Optional[str], typer.Option(
    "--sparse", metavar="SPEC", rich_help_panel="sagegen attention", show_default=False,
    help="Block-sparse attention for the sagegen variant (off by default): topk=0.5, cdf=0.95, sta, radial or "
         "calib=FILE (from `sagegen calibrate`), options after commas (steps=0.25, blocks=0, sim=0.2, "
         "window=3x8x8). Check quality with `sagegen compare --sparse ...` then `sagegen eval` (docs/sparse.md).")]


def parse(value: str | None, option: str = "--sparse"):
    """The `SparseConfig` for a sparse spec given as `option`, or None; UsageProblem naming `option`."""
    if value is None:
        return None
    from sagegen.sparse.text import parse_sparse_arg

    try:
        return parse_sparse_arg(value)
    except ValueError as e:
        raise UsageProblem(f"{option} {value!r}: {e}", option) from None
