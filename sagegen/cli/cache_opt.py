"""The ``--cache SPEC`` option of `run` and `compare`: one of diffusers' step caches (or cache-dit's) on every
variant's denoisers (the same schedule for stock and sagegen), parsed before any model loads; a bad value is a
usage error (exit 2) naming the option. The grammar: `sagegen.patch.cache_spec`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from sagegen.cli.errors import UsageProblem

OPTION = "--cache"

Cache = Annotated[Optional[str], typer.Option(
    OPTION, metavar="SPEC", rich_help_panel="Memory and speed", show_default=False,
    help="A step cache on every variant (off by default): fbcache=0.08, taylorseer=3 (or "
         "interval:3,order:1,warmup:3), magcache=FILE, pab=2, fastercache=2, seacache=0.25, "
         "cachedit=Fn:1,Bn:0,threshold:0.08,warmup:2 (cache-dit). The manifest records what it computed per call. "
         "Check quality with `sagegen compare --cache ...` then `sagegen eval` against an uncached run.")]


def parse(value: str | None, steps: int, family: str | None = None, sequence_split: bool = False):
    """The `CacheSpec` for ``value`` at ``steps`` denoising steps on a model of ``family`` (under a ``--cp``
    sequence split when ``sequence_split``), or None; UsageProblem naming the option."""
    if value is None:
        return None
    from sagegen.patch.cache_spec import CacheSpecError, bind_steps, check_family, check_parallel
    from sagegen.patch.cache_spec import parse as parse_spec

    try:
        spec = bind_steps(parse_spec(value), steps)
        if family is not None:
            check_family(spec, family)
        check_parallel(spec, sequence_split)
    except CacheSpecError as e:
        raise UsageProblem(f"{OPTION} {value!r}: {e}", OPTION) from None
    return spec
