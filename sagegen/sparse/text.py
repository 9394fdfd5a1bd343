"""`--sparse` text <-> `SparseConfig`, and the calibration file.

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

from .config import SparseConfig

CALIB_FORMAT = "sagegen-sparse-calibration/1"


class SparseArgError(ValueError):
    """A --sparse value that does not parse (the CLI exits 2 with this message)."""


def _triple(key: str, v: str) -> tuple[int, int, int]:
    parts = v.lower().split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise SparseArgError(f"--sparse {key}={v!r}: expected three ints as FxHxW, e.g. {key}=3x8x8")
    return tuple(int(p) for p in parts)


def _number(key: str, v: str) -> float:
    try:
        return float(v)
    except ValueError:
        raise SparseArgError(f"--sparse {key}={v!r}: expected a number") from None


def parse_sparse_arg(text: str) -> SparseConfig:
    """Parse a --sparse value (see the module doc). Raises SparseArgError naming the bad part."""
    text = text.strip()
    head, _, rest = text.partition(":") if ":" in text.split(",")[0] else text.partition(",")
    items = [p.strip() for p in rest.split(",") if p.strip()] if rest else []
    kw: dict = {}
    key, eq, val = head.partition("=")
    key = key.strip().lower()
    if key in ("topk", "cdf"):
        if not eq:
            raise SparseArgError(f"--sparse {key} needs a value, e.g. {key}=0.5")
        kw.update(mode=key, value=_number(key, val))
    elif key in ("sta", "radial"):
        kw["mode"] = key
    elif key == "calib":
        if not val:
            raise SparseArgError("--sparse calib=FILE: name the calibration JSON from `sagegen calibrate`")
        kw.update(load_calibration(val))
    else:
        raise SparseArgError(f"--sparse {text!r}: start with topk=FRACTION, cdf=MASS, sta, radial or calib=FILE")
    for item in items:
        k, eq, v = item.partition("=")
        k = k.strip().lower()
        if not eq:
            raise SparseArgError(f"--sparse option {item!r}: expected key=value")
        if k == "sim":
            kw["sim_threshold"] = _number(k, v)
        elif k == "steps":
            kw["dense_steps"] = _number(k, v)
        elif k == "value":
            kw["value"] = _number(k, v)
        elif k == "blocks":
            kw["dense_blocks"] = () if v.strip().lower() == "none" else tuple(
                int(b) if b.strip().lstrip("-").isdigit() else b.strip() for b in v.split("+"))
        elif k == "min_tokens":
            kw["min_tokens"] = int(_number(k, v))
        elif k == "first":
            kw["keep_first"] = v.strip() not in ("0", "false", "no")
        elif k in ("window", "grid"):
            kw[k] = _triple(k, v)
        elif k == "decay":
            kw["decay"] = int(_number(k, v))
        elif k == "text":
            a, _, b = v.partition(":")
            kw["text"] = (int(_number(k, a)), int(_number(k, b)))
        else:
            raise SparseArgError(f"--sparse option {k!r} is unknown; options: sim, steps, value, blocks, "
                                 "min_tokens, first, window, grid, decay, text")
    try:
        return SparseConfig(**kw)
    except (TypeError, ValueError) as e:
        raise SparseArgError(f"--sparse {text!r}: {e}") from None


def load_calibration(path: str | os.PathLike) -> dict:
    """SparseConfig fields from a `sagegen calibrate` file (mode, value, layer_values, sim_threshold...)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise SparseArgError(f"--sparse calib={path}: no such file") from None
    except (OSError, json.JSONDecodeError) as e:
        raise SparseArgError(f"--sparse calib={path}: not a readable calibration JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != CALIB_FORMAT:
        raise SparseArgError(f"--sparse calib={path}: not a sagegen calibration file (format {CALIB_FORMAT!r})")
    fields = data.get("config", {})
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in fields.items()
            if k in ("mode", "value", "sim_threshold", "layer_values", "dense_steps", "dense_blocks", "min_tokens")}


def save_calibration(path: str | os.PathLike, cfg: SparseConfig, details: dict) -> None:
    """Write the calibration JSON atomically."""
    fields = {k: v for k, v in cfg.to_dict().items()
              if k in ("mode", "value", "sim_threshold", "layer_values", "dense_steps", "dense_blocks", "min_tokens")}
    data = {"format": CALIB_FORMAT, "config": fields, **details}
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, p)
