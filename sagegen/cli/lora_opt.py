"""The ``--lora PATH[:SCALE]`` option of `run` and `compare` (repeatable): LoRA files loaded into the pipeline
after it is built and before any variant runs, so stock and sagegen generate with the same adapters (sagegen
patches a pipeline that already holds them). Checked before any model loads: the file exists, the scale is a
finite number, peft is installed; a mistake is a usage error (exit 2) naming the option. Each LoRA is recorded
in the run's settings (so in the manifest and the run directory's hash) with its file's SHA-256."""

from __future__ import annotations

import hashlib
import importlib.util
import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from sagegen.cli.errors import UsageProblem

OPTION = "--lora"

Lora = Annotated[Optional[list[str]], typer.Option(
    OPTION, metavar="PATH[:SCALE]", rich_help_panel="Generation", show_default=False,
    help="A LoRA file (.safetensors, as diffusers' load_lora_weights reads it) for every variant, at SCALE "
         "(default 1.0); repeat for several. Loaded before sagegen patches (FP8 linears run the base beside the "
         "bf16 LoRA branch). Needs peft: pip install 'sagegen[lora]'. Recipes: docs/lora.md.")]


def _split(value: str) -> tuple[str, str | None]:
    """(path, scale text or None): the scale follows the last ':' unless the whole value names a file."""
    if ":" not in value or Path(value).expanduser().is_file():
        return value, None
    path, _, scale = value.rpartition(":")
    return path, scale


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def parse(values: list[str] | None) -> list[dict] | None:
    """[{"path", "sha256", "scale"}] for the option's values in order, or None; UsageProblem naming the option."""
    if not values:
        return None
    loras = []
    for value in values:
        text, scale_text = _split(value)
        scale = 1.0
        if scale_text is not None:
            try:
                scale = float(scale_text)
            except ValueError:
                raise UsageProblem(f"{value!r}: the scale {scale_text!r} is not a number (PATH[:SCALE], e.g. "
                                   "lora.safetensors:0.8)", OPTION) from None
            if not math.isfinite(scale):
                raise UsageProblem(f"{value!r}: the scale must be a finite number, got {scale_text!r}", OPTION)
        path = Path(text).expanduser()
        if not text or not path.is_file():
            what = "is a directory; give the LoRA file in it" if path.is_dir() else "no such file"
            raise UsageProblem(f"{value!r}: {what}", OPTION)
        loras.append({"path": str(path.resolve()), "sha256": _sha256(path), "scale": scale})
    if importlib.util.find_spec("peft") is None:
        raise UsageProblem("loading a LoRA needs peft, which is not installed: pip install 'sagegen[lora]' "
                           "(or pip install 'peft>=0.17')", OPTION)
    return loras
