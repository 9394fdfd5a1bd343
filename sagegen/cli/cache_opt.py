"""The ``--cache SPEC`` option of `run` and `compare`: one of diffusers' step caches on every variant's denoisers
(the same schedule for stock and sagegen), parsed before any model loads; a bad value is a usage error (exit 2)
naming the option. The grammar: `sagegen.patch.cache_spec`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from sagegen.cli.errors import UsageProblem

OPTION = "--cache"

Cache = Annotated[Optional[str], typer.Option(
    OPTION, metavar="SPEC", rich_help_panel="Memory and speed", show_default=False,
    help="A diffusers step cache on every variant (off by default): fbcache=0.08, taylorseer=3 (or "
         "interval:3,order:1,warmup:3), magcache=FILE, pab=2. The manifest records what it computed per call. "
         "Check quality with `sagegen compare --cache ...` then `sagegen eval` against an uncached run.")]


def parse(value: str | None, steps: int):
    """The `CacheSpec` for ``value`` at ``steps`` denoising steps, or None; UsageProblem naming the option."""
    if value is None:
        return None
    from sagegen.patch.cache_spec import CacheSpecError, check_steps
    from sagegen.patch.cache_spec import parse as parse_spec

    try:
        spec = parse_spec(value)
        check_steps(spec, steps)
    except CacheSpecError as e:
        raise UsageProblem(f"{OPTION} {value!r}: {e}", OPTION) from None
    return spec
