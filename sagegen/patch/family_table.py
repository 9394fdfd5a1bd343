"""The one table of what the patcher does per model family.

Each module of `sagegen.patch.families` describes its family in a `FamilyCode` and registers it here when it is
imported; `sagegen.patch.families` imports them all, and `sagegen.patch` imports that package, so the table is
full before anything reads it. The readers (the fused route, block fusion, the backend route, GELU fusion, the
context-parallel plans) look families up here and import no family module. Which class belongs to which family
is `sagegen.models.families`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping


@dataclass(frozen=True)
class FamilyCode:
    """What sagegen runs for one family; every field is optional.

    - ``prologue``: the fused route's processor call, ``fn(original, session, attn, args, kwargs)`` -> the
      output, or None to run the original processor (the family's Q/K norm + rotary prologue fused).
    - ``blocks``: ``(is_fusable(block), forward)`` pairs: a transformer block that passes the check gets a
      subclass whose forward is ``forward(self, stock, can_run, residual_norm, *args, **kwargs)`` (block fusion).
    - ``dispatch_calls``: for the backend route, the stock processor ``__call__``'s qualified name ->
      ``fn(processor)`` giving sagegen's equivalent function (or None: the processor's own ``__call__`` runs).
    - ``gelu_blocks``: ``(is_block, install, restore)`` for blocks whose FP8 projection quantizes a GELU output
      itself (GELU fusion, `sagegen.patch.gelu_fp8`).
    - ``cp_plans``: model class name -> ``fn()`` giving the context-parallel plan sagegen supplies where
      diffusers has none; ``cp_hooks``: model class name -> ``fn(model, parallel_config)`` installing what such
      a plan needs besides splitting and gathering.
    """

    name: str
    prologue: Callable | None = None
    blocks: tuple[tuple[Callable, Callable], ...] = ()
    dispatch_calls: Mapping[str, Callable] = field(default_factory=dict)
    gelu_blocks: tuple[Callable, Callable, Callable] | None = None
    cp_plans: Mapping[str, Callable] = field(default_factory=dict)
    cp_hooks: Mapping[str, Callable] = field(default_factory=dict)


_TABLE: dict[str, FamilyCode] = {}


def register(code: FamilyCode) -> FamilyCode:
    """Add a family (a module of `sagegen.patch.families` calls this once, when imported)."""
    if code.name in _TABLE and _TABLE[code.name] is not code:
        raise ValueError(f"family {code.name!r} is registered twice")
    _TABLE[code.name] = code
    return code


def families() -> tuple[FamilyCode, ...]:
    """Every registered family, in registration order."""
    if not _TABLE:
        raise RuntimeError("no model family is registered: import sagegen.patch.families first "
                           "(importing sagegen.patch does)")
    return tuple(_TABLE.values())


def family(name: str) -> FamilyCode | None:
    """The family called ``name``, or None (a model sagegen patches by route only)."""
    families()
    return _TABLE.get(name)


def dispatch_call_for(qualname: str | None) -> Callable | None:
    """The ``fn(processor)`` giving sagegen's equivalent of the stock ``__call__`` named ``qualname``, or None."""
    return next((c.dispatch_calls[qualname] for c in families() if qualname in c.dispatch_calls), None)


def cp_plan(class_name: str) -> Callable | None:
    return next((c.cp_plans[class_name] for c in families() if class_name in c.cp_plans), None)


def cp_hook(class_name: str) -> Callable | None:
    return next((c.cp_hooks[class_name] for c in families() if class_name in c.cp_hooks), None)
