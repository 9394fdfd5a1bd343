"""Sparse spec text (the CLI's `--sparse`, `sagegen.patch(sparse="...")`) <-> `SparseConfig`, and the
calibration file.

Grammar: a head, then options, separated by commas (a colon may follow the head instead):
    topk=0.5 | cdf=0.95 | sta | radial | calib=FILE
    options: sim=0.3  steps=0.25  blocks=0+1 (or none)  min_tokens=4096  first=0|1  window=3x8x8
             decay=2  grid=FxHxW  text=START:STOP
Examples: ``topk=0.5``, ``cdf=0.9,sim=0.2,steps=0.3``, ``sta:window=1x6x6``, ``radial,decay=3``,
``calib=calib.json`` (from `sagegen calibrate`), ``calib=calib.json,steps=0.1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sagegen.sparse.sparse_config import SparseConfig

CALIB_FORMAT = "sagegen-sparse-calibration/1"


class SparseArgError(ValueError):
    """A sparse spec that does not parse. The message names the part at fault but no option: the CLI prefixes
    ``--sparse`` (or calibrate's ``--sparse-options``), `sagegen.patch` prefixes ``sparse=``."""


def _triple(key: str, v: str) -> tuple[int, int, int]:
    parts = v.lower().split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise SparseArgError(f"{key}={v!r}: expected three ints as FxHxW, e.g. {key}=3x8x8")
    return tuple(int(p) for p in parts)


def _number(key: str, v: str) -> float:
    try:
        return float(v)
    except ValueError:
        raise SparseArgError(f"{key}={v!r}: expected a number") from None


def _integer(key: str, v: str) -> int:
    """A whole number: ``decay=1.5`` or ``min_tokens=4096.5`` is a mistake, not something to round."""
    try:
        return int(v.strip())
    except ValueError:
        raise SparseArgError(f"{key}={v!r}: expected an integer") from None


def _flag(key: str, v: str) -> bool:
    low = v.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise SparseArgError(f"{key}={v!r}: expected 1 or 0 (true or false)")


def _blocks(v: str) -> tuple[int | str, ...]:
    """``0+1+transformer_blocks.3`` or ``none``; every entry named (an empty one is a typo, not "no block")."""
    if v.strip().lower() == "none":
        return ()
    entries = [b.strip() for b in v.split("+")]
    if not all(entries):
        raise SparseArgError(f"blocks={v!r}: expected block indices or module names joined by +, e.g. "
                             "blocks=0+1, or blocks=none for no dense block")
    return tuple(int(b) if b.lstrip("-").isdigit() else b for b in entries)


def _text_range(v: str) -> tuple[int, int]:
    a, sep, b = v.partition(":")
    if not sep:
        raise SparseArgError(f"text={v!r}: expected START:STOP token indices, e.g. text=-226:0")
    return _integer("text", a), _integer("text", b)


def parse_sparse_arg(text: str) -> SparseConfig:
    """Parse a sparse spec (see the module doc). Raises SparseArgError naming the bad part; callers add the
    whole spec and where it came from."""
    text = text.strip()
    head, _, rest = text.partition(":") if ":" in text.split(",")[0] else text.partition(",")
    items = [p.strip() for p in rest.split(",") if p.strip()] if rest else []
    kw: dict = {}
    key, eq, val = head.partition("=")
    key = key.strip().lower()
    if key in ("topk", "cdf"):
        if not eq:
            raise SparseArgError(f"{key} needs a value, e.g. {key}=0.5")
        kw.update(mode=key, value=_number(key, val))
    elif key in ("sta", "radial"):
        kw["mode"] = key
    elif key == "calib":
        if not val:
            raise SparseArgError("calib=FILE: name the calibration JSON from `sagegen calibrate`")
        kw.update(load_calibration(val))
    else:
        raise SparseArgError("start with topk=FRACTION, cdf=MASS, sta, radial or calib=FILE")
    for item in items:
        k, eq, v = item.partition("=")
        k = k.strip().lower()
        if not eq:
            raise SparseArgError(f"option {item!r}: expected key=value")
        if k == "sim":
            kw["sim_threshold"] = _number(k, v)
        elif k == "steps":
            kw["dense_steps"] = _number(k, v)
        elif k == "value":
            kw["value"] = _number(k, v)
        elif k == "blocks":
            kw["dense_blocks"] = _blocks(v)
        elif k == "min_tokens":
            kw["min_tokens"] = _integer(k, v)
        elif k == "first":
            kw["keep_first"] = _flag(k, v)
        elif k in ("window", "grid"):
            kw[k] = _triple(k, v)
        elif k == "decay":
            kw["decay"] = _integer(k, v)
        elif k == "text":
            kw["text"] = _text_range(v)
        else:
            raise SparseArgError(f"option {k!r} is unknown; options: sim, steps, value, blocks, "
                                 "min_tokens, first, window, grid, decay, text")
    try:
        return SparseConfig(**kw)
    except (TypeError, ValueError) as e:
        raise SparseArgError(str(e).replace("SparseConfig.", "")) from None


def load_calibration(path: str | os.PathLike) -> dict:
    """SparseConfig fields from a `sagegen calibrate` file (mode, value, layer_values, sim_threshold...)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise SparseArgError(f"calib={path}: no such file") from None
    except (OSError, json.JSONDecodeError) as e:
        raise SparseArgError(f"calib={path}: not a readable calibration JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != CALIB_FORMAT:
        raise SparseArgError(f"calib={path}: not a sagegen calibration file (format {CALIB_FORMAT!r})")
    fields = data.get("config", {})
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in fields.items()
            if k in ("mode", "value", "sim_threshold", "layer_values", "dense_steps", "dense_blocks", "min_tokens")}


def save_calibration(path: str | os.PathLike, cfg: SparseConfig, details: dict) -> None:
    """Write the calibration JSON atomically."""
    fields = {k: v for k, v in cfg.to_dict().items()
              if k in ("mode", "value", "sim_threshold", "layer_values", "dense_steps", "dense_blocks", "min_tokens")}
    data = {"format": CALIB_FORMAT, "config": fields, **details}
    from sagegen.runs.files import atomic_write_text  # a unique temporary name beside it, removed on failure

    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))
