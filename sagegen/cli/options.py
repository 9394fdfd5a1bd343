"""Parsing and checking what `run` and `compare` share: prompts, seeds, sizes, kernel config, policy.

Everything here raises `UsageProblem` (exit 2) naming the option and the allowed values.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Sequence

from sagegen.cli.errors import UsageProblem

PROMPTS_ENV = "SAGEGEN_PROMPTS_DIR"
ATTENTION = ("sage", "sdpa")
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
OFFLOAD_CHOICES = ("none", "model", "sequential")
BACKEND_CHOICES = ("auto", "triton", "reference")


def prompts_dir() -> Path:
    """The built-in prompt sets: $SAGEGEN_PROMPTS_DIR, else prompts/ of the source tree (editable installs),
    else the copy a wheel installs under <prefix>/share/sagegen/prompts (pyproject's data-files)."""
    if os.environ.get(PROMPTS_ENV):
        return Path(os.environ[PROMPTS_ENV])
    source = Path(__file__).resolve().parents[2] / "prompts"
    if source.is_dir():
        return source
    return Path(sysconfig.get_path("data")) / "share" / "sagegen" / "prompts"


def builtin_prompt_sets() -> dict[str, Path]:
    d = prompts_dir()
    return {p.stem: p for p in sorted(d.glob("*.txt"))} if d.is_dir() else {}


def read_prompt_file(path: Path) -> list[str]:
    """One prompt per line; blank lines and lines starting with ``#`` are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageProblem(f"{path} is not UTF-8 text ({e.reason})", "--prompts") from e
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def load_prompts(prompt: Sequence[str], prompts: str | None, max_prompts: int | None) -> list[str]:
    """The prompt list from --prompt (repeatable) and/or --prompts FILE|SET."""
    out = [p.strip() for p in prompt]
    if any(not p for p in out):
        raise UsageProblem("an empty prompt was given; pass some text", "--prompt")
    if prompts is not None:
        sets = builtin_prompt_sets()
        path = Path(prompts).expanduser()
        if path.is_file():
            found = read_prompt_file(path)
        elif prompts in sets:
            found = read_prompt_file(sets[prompts])
        else:
            names = ", ".join(sets) or "none found"
            raise UsageProblem(f"{prompts!r} is neither a file nor a built-in prompt set (built-in: {names})",
                               "--prompts")
        if not found:
            raise UsageProblem(f"{prompts} holds no prompts (one per line; # starts a comment)", "--prompts")
        out += found
    if not out:
        raise UsageProblem("no prompt given; pass --prompt TEXT or --prompts FILE (or a built-in set: "
                           f"{', '.join(builtin_prompt_sets()) or 'smoke'})", "--prompt")
    if max_prompts is not None:
        out = out[:max_prompts]
    return out


def _seed_ranges(values: Sequence[str]) -> list[tuple[int, int]]:
    """The inclusive (first, last) ranges that repeated --seed values name, without expanding them."""
    ranges: list[tuple[int, int]] = []
    for value in values or ["0"]:
        for token in str(value).replace(" ", "").split(","):
            if not token:
                continue
            try:
                if "-" in token[1:]:
                    a, b = token.split("-", 1)
                    lo, hi = int(a), int(b)
                    if hi < lo:
                        raise ValueError
                else:
                    lo = hi = int(token)
            except ValueError:
                raise UsageProblem(f"{token!r} is not a seed; use integers >= 0 such as 7, 0,1,2 or 0-3",
                                   "--seed") from None
            if lo < 0 or hi >= 2**63:
                raise UsageProblem("seeds must be integers from 0 to 2**63-1, such as 7, 0,1,2 or 0-3", "--seed")
            ranges.append((lo, hi))
    if not ranges:
        raise UsageProblem("no seed given; use e.g. --seed 0 or --seed 0-3", "--seed")
    return ranges


def count_seeds(values: Sequence[str]) -> int:
    """How many seeds --seed names (repeats counted), computed without building the list."""
    return sum(hi - lo + 1 for lo, hi in _seed_ranges(values))


def parse_seeds(values: Sequence[str]) -> list[int]:
    """Seeds from repeated --seed values, each ``7``, ``0,1,2`` or ``0-3`` (inclusive); default [0].

    Check `count_seeds` against a limit first: ``0-100000000`` expands to a hundred million ints."""
    seeds: list[int] = []
    for lo, hi in _seed_ranges(values):
        seeds.extend(range(lo, hi + 1))
    return list(dict.fromkeys(seeds))


def _parse_value(field: dataclasses.Field, raw: str) -> Any:
    low = raw.strip().lower()
    if field.name.startswith("smooth_"):
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{field.name} takes true or false, got {raw!r}")
    if field.name in ("block_q", "block_k"):
        if low in ("none", "auto", "default", ""):
            return None
        try:
            return int(low)
        except ValueError:
            raise ValueError(f"{field.name} takes none or one of 16, 32, 64, 128, 256, got {raw!r}") from None
    return raw.strip()


def kernel_config(overrides: Sequence[str]):
    """sagegen.DIFFUSION_CONFIG with --kernel KEY=VALUE overrides applied."""
    from sagegen.config import DIFFUSION_CONFIG, SageConfig

    fields = {f.name: f for f in dataclasses.fields(SageConfig)}
    changes: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            raise UsageProblem(f"{item!r}: use KEY=VALUE with KEY one of {', '.join(fields)}", "--kernel")
        try:
            changes[key] = _parse_value(fields[key], raw)
        except ValueError as e:
            raise UsageProblem(str(e), "--kernel") from None
    try:
        return DIFFUSION_CONFIG.replace(**changes)
    except (ValueError, TypeError) as e:
        raise UsageProblem(str(e).replace("SageConfig.", ""), "--kernel") from None


def precision_policy(blocks: str | None, first_steps: int, last_steps: int):
    """The patcher's PrecisionPolicy from --fp-blocks / --fp-first-steps / --fp-last-steps (None: none)."""
    if not blocks and not first_steps and not last_steps:
        return None
    from sagegen.patch.precision_policy import PrecisionPolicy

    entries: list[int | str] = []
    for token in (blocks or "").split(","):
        token = token.strip()
        if token:
            try:
                entries.append(int(token))
            except ValueError:
                entries.append(token)
    try:
        return PrecisionPolicy(blocks=tuple(entries), first_steps=first_steps, last_steps=last_steps)
    except (TypeError, ValueError) as e:
        raise UsageProblem(str(e).replace("PrecisionPolicy.", ""), "--fp-blocks") from None


def finite_number(low: float | None = None, high: float | None = None):
    """The callback of a float option: a finite number from `low` to `high`. Typer's own min/max let ``nan``
    through (or refuse it naming a bound it does not cross) and let ``inf`` through where there is no max."""
    bounds = [f">= {low:g}" if low is not None else "", f"<= {high:g}" if high is not None else ""]
    allowed = (f"from {low:g} to {high:g}" if low is not None and high is not None else
               "".join(bounds)).strip()

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
            import typer

            raise typer.BadParameter(f"{value} is not allowed; give a finite number {allowed}".rstrip())
        return value

    return check


def choice(value: str, allowed: Sequence[str], option: str) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise UsageProblem(f"{value!r} is not allowed; choose one of {', '.join(allowed)}", option)
    return v


_invocation: list[str] = []


def set_invocation(args: Sequence[str]) -> None:
    """Remember the arguments the CLI was given (the manifest's ``command``)."""
    _invocation[:] = ["sagegen", *args]


def command_line() -> list[str]:
    if _invocation:
        return list(_invocation)
    argv = list(sys.argv)
    if argv:
        argv[0] = Path(argv[0]).name
    return argv
