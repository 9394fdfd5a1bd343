"""``--cache SPEC``: which of diffusers' step caches a run stacks on its denoisers, parsed without importing
diffusers (the command line checks it before anything loads), built into diffusers' own config when applied.

    fbcache=0.08                          FirstBlockCache, threshold 0.08 (skips the other blocks while the first
                                          block's output changes by less than that, relatively)
    taylorseer=3                          TaylorSeerCache: compute every 3rd step, predict the rest (Taylor series)
    taylorseer=interval:3,order:1,warmup:3  ... the same with its order and the first steps always computed
    magcache=FILE                         MagCache with the magnitude ratios of FILE (JSON list, from calibration)
    pab=2                                 PyramidAttentionBroadcast: self-attention reused over 2 steps
                                          (inside diffusers' default timestep range 100-800)

A cache's skips depend on the model's outputs: on random weights only the fixed schedules (TaylorSeer's
interval, PAB's range) skip what they would on real ones. diffusers >= 0.36 (FirstBlockCache, TaylorSeer,
MagCache: 0.36 / 0.37).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

KINDS = ("fbcache", "taylorseer", "magcache", "pab")


class CacheSpecError(ValueError):
    """A ``--cache`` spec that names no cache or gives it values it cannot take."""


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    kind: str
    params: tuple[tuple[str, object], ...] = ()

    def get(self, name: str, default=None):
        return dict(self.params).get(name, default)

    def to_dict(self) -> dict:
        return {"kind": self.kind, **dict(self.params)}

    @classmethod
    def from_dict(cls, data: dict) -> "CacheSpec":
        """The spec `to_dict` wrote (a run's manifest)."""
        return cls(data["kind"], tuple((k, v) for k, v in data.items() if k != "kind"))

    def text(self) -> str:
        return f"{self.kind}=" + ",".join(f"{k}:{v}" for k, v in self.params)


def _number(text: str, what: str, *, integer: bool = False, low: float = 0.0, low_open: bool = True):
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise CacheSpecError(f"{what}={text!r} is not {'an integer' if integer else 'a number'}") from None
    if not math.isfinite(value) or value < low or (low_open and value == low):
        raise CacheSpecError(f"{what}={text!r} must be {'>' if low_open else '>='} {low:g}")
    return value


def parse(text: str) -> CacheSpec:
    """``fbcache=0.08`` / ``taylorseer=3`` / ``taylorseer=interval:3,order:2,warmup:3`` / ``magcache=FILE`` /
    ``pab=2`` -> CacheSpec; CacheSpecError naming what is wrong otherwise."""
    kind, sep, rest = text.strip().partition("=")
    kind = kind.strip().lower()
    if kind not in KINDS or not sep or not rest.strip():
        raise CacheSpecError(f"{text!r}: write one of fbcache=THRESHOLD, taylorseer=INTERVAL (or "
                             "interval:N,order:K,warmup:W), magcache=FILE, pab=STEPS")
    rest = rest.strip()
    if kind == "fbcache":
        return CacheSpec(kind, (("threshold", _number(rest, "fbcache")),))
    if kind == "pab":
        return CacheSpec(kind, (("skip", _number(rest, "pab", integer=True, low=1, low_open=False)),))
    if kind == "magcache":
        path = Path(rest).expanduser()
        if not path.is_file():
            raise CacheSpecError(f"magcache={rest!r}: no such file (a JSON list of magnitude ratios, one per step, "
                                 "from a MagCache calibration)")
        ratios = _ratios(path)
        return CacheSpec(kind, (("file", str(path)), ("steps", len(ratios))))
    fields = {"interval": 3, "order": 1, "warmup": 3}
    if ":" not in rest:
        rest = f"interval:{rest}"
    seen = set()
    for part in rest.split(","):
        name, sep, value = part.strip().partition(":")
        if name not in fields or not sep or name in seen:
            raise CacheSpecError(f"taylorseer={rest!r}: write interval:N,order:K,warmup:W (each at most once)")
        seen.add(name)
        fields[name] = _number(value, f"taylorseer {name}", integer=True, low=0 if name == "warmup" else 1,
                               low_open=False)
    return CacheSpec(kind, tuple(fields.items()))


def _ratios(path: Path) -> list[float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CacheSpecError(f"magcache={str(path)!r}: not a JSON file ({e})") from None
    ratios = data.get("mag_ratios") if isinstance(data, dict) else data
    if (not isinstance(ratios, list) or len(ratios) < 2
            or not all(isinstance(r, (int, float)) and math.isfinite(r) and r > 0 for r in ratios)):
        raise CacheSpecError(f"magcache={str(path)!r}: expected a JSON list of >= 2 positive numbers (or "
                             '{"mag_ratios": [...]})')
    return [float(r) for r in ratios]


def check_steps(spec: CacheSpec | None, steps: int) -> None:
    """A MagCache file was calibrated for a number of steps; another count would misalign its ratios."""
    if spec is not None and spec.kind == "magcache" and spec.get("steps") != steps:
        raise CacheSpecError(f"magcache file {spec.get('file')!r} holds {spec.get('steps')} ratios, for "
                             f"{spec.get('steps')} steps; this run has {steps}: calibrate again at {steps} steps")


def build(spec: CacheSpec, model=None, pipe=None):
    """diffusers' config for ``spec`` on the denoiser ``model`` (TaylorSeer: the model's own attention modules;
    ``pipe``: for the timestep PAB reads)."""
    import diffusers

    if spec.kind == "fbcache":
        return diffusers.FirstBlockCacheConfig(threshold=spec.get("threshold"))
    if spec.kind == "taylorseer":
        return diffusers.TaylorSeerCacheConfig(cache_interval=spec.get("interval"), max_order=spec.get("order"),
                                               disable_cache_before_step=spec.get("warmup"),
                                               cache_identifiers=_attention_patterns(model))
    if spec.kind == "magcache":
        ratios = _ratios(Path(spec.get("file")))
        return diffusers.MagCacheConfig(mag_ratios=ratios, num_inference_steps=len(ratios))
    if pipe is None:
        raise ValueError("pab needs the pipeline (its current timestep)")
    return diffusers.PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=spec.get("skip"),
        current_timestep_callback=lambda: getattr(pipe, "current_timestep", None) or getattr(pipe, "_current_timestep"))


def _attention_patterns(model) -> list[str] | None:
    """Exact-name patterns of the attention modules in ``model``'s main blocks. diffusers' default TaylorSeer
    patterns (``^blocks.*attn`` and the like, matched whole) name no module of Wan (``blocks.0.attn1``), whose
    cache then computed every step."""
    import re

    from sagegen.patch.precision_policy import main_blocks
    from sagegen.patch.targets import attention_modules

    if model is None:
        return None
    names = list(attention_modules(model))
    blocks = main_blocks(model, names)
    inside = [n for n in names if any(n.startswith(b + ".") for b in blocks)]
    return [re.escape(n) for n in inside] or None


def apply(pipe, spec: CacheSpec) -> list:
    """Enable ``spec`` on every denoiser of ``pipe`` (diffusers' ``enable_cache``); returns those denoisers."""
    from sagegen.patch.targets import denoisers

    models = list(denoisers(pipe)[0].values())
    for model in models:
        model.enable_cache(build(spec, model, pipe))
    return models


def remove(models: list) -> None:
    """Disable the caches `apply` enabled."""
    for model in models:
        model.disable_cache()
