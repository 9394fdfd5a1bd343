"""The ``name:value,...`` fields of a ``--cache`` spec (``taylorseer=``, ``fastercache=``, ``seacache=``,
``cachedit=``): each field a number in its range or one of a few values, named case-insensitively, given at most
once; a bare value is the kind's main field. Parsed without importing anything heavy (the command line checks a
spec before a model loads)."""

from __future__ import annotations

import dataclasses
import math


class CacheSpecError(ValueError):
    """A ``--cache`` spec that names no cache or gives it values it cannot take."""


@dataclasses.dataclass(frozen=True)
class Field:
    default: object = None     # None: recorded only when given
    integer: bool = True
    low: float = 0.0
    low_open: bool = False     # the value must be above `low` (else at least `low`)
    choices: tuple = ()        # the values it may take instead of a range (words are kept as text)


def number(text: str, what: str, *, integer: bool = False, low: float = 0.0, low_open: bool = True):
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise CacheSpecError(f"{what}={text!r} is not {'an integer' if integer else 'a number'}") from None
    if not math.isfinite(value) or value < low or (low_open and value == low):
        raise CacheSpecError(f"{what}={text!r} must be {'>' if low_open else '>='} {low:g}")
    return value


def _value(kind: str, name: str, text: str, field: Field):
    if field.choices:
        words = {str(c).lower(): c for c in field.choices}
        if text.lower() not in words:
            raise CacheSpecError(f"{kind} {name}={text!r} must be one of {', '.join(map(str, field.choices))}")
        return words[text.lower()]
    return number(text, f"{kind} {name}", integer=field.integer, low=field.low, low_open=field.low_open)


def parse_fields(kind: str, rest: str, fields: dict[str, Field], main: str, usage: str,
                 free: frozenset[str] = frozenset()) -> tuple[tuple[str, object], ...]:
    """``rest`` (what follows ``kind=``) -> ((name, value), ...) in ``fields``' order, defaults filled in.
    ``main``: the field a bare value sets; ``free``: fields whose text is kept as given (checked by the caller)."""
    if ":" not in rest:
        rest = f"{main}:{rest}"
    names = {name.lower(): name for name in fields}
    given: dict[str, object] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition(":")
        name = names.get(name.strip().lower())
        if name is None or not sep or name in given or not value.strip():
            raise CacheSpecError(f"{kind}={rest!r}: write {usage} (each at most once)")
        value = value.strip()
        given[name] = value if name in free else _value(kind, name, value, fields[name])
    out = []
    for name, field in fields.items():
        value = given.get(name, field.default)
        if value is not None:
            out.append((name, value))
    return tuple(out)
