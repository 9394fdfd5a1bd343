"""``--cache SPEC``: which step cache a run stacks on its denoisers (one of diffusers' cache hooks, or cache-dit),
parsed without importing diffusers (the command line checks it before anything loads), built into the cache's
own config when applied.

    fbcache=0.08                          FirstBlockCache, threshold 0.08 (skips the other blocks while the first
                                          block's output changes by less than that, relatively)
    taylorseer=3                          TaylorSeerCache: compute every 3rd step, predict the rest (Taylor series)
    taylorseer=interval:3,order:1,warmup:3  ... the same with its order and the first steps always computed
    magcache=FILE                         MagCache with the magnitude ratios of FILE (JSON list, from calibration)
    pab=2                                 PyramidAttentionBroadcast: self-attention reused over 2 steps
                                          (inside diffusers' default timestep range 100-800)
    fastercache=2  or  fastercache=spatial:2,uncond:5
                                          FasterCache: self-attention computed every 2nd step (approximated from
                                          the last two in between), the unconditional half of a batched guidance
                                          call every 5th step (approximated in frequency space in between), inside
                                          diffusers' default timestep ranges (<= 681 and <= 641). Denoisers that
                                          take guidance as one batched call with video latents: CogVideoX, Mochi
    seacache=0.25  or  seacache=threshold:T,order:R,warmup:W,end:E,max_consecutive:M
                                          SeaCache (diffusers >= 0.41): the blocks skipped while the accumulated
                                          change of its spectral indicator stays below T (residual predicted at
                                          order R, 0 or 1); the first W and last E steps always computed, at most M
                                          skips in a row (0: no limit). Wan text-to-video (diffusers' adapter)
    cachedit=Fn:1,Bn:0,threshold:0.08,warmup:2
                                          cache-dit's DBCache (``pip install sagegen[cachedit]``): the first Fn and
                                          last Bn blocks always run; the others are skipped while the first blocks'
                                          residual changes by less than threshold (relative L1); the first warmup
                                          steps always computed. Also max_cached:N (at most N cached steps),
                                          max_continuous:N (in a row), mask:fast (cache-dit's named step masks
                                          slow/medium/fast/ultra, or 0/1 per step: 1 computes, 0 may cache) with
                                          policy:dynamic (a 0 step still asks the threshold) or policy:static (a 0
                                          step is served from the cache: a fixed schedule), taylorseer:K
                                          (cache-dit's TaylorSeer calibrator of order K). Defaults are cache-dit's:
                                          Fn:8, Bn:0, threshold:0.08, warmup:8. A bare value is the threshold.

A cache's skips depend on the model's outputs: on random weights only the fixed schedules (TaylorSeer's
interval, PAB's and FasterCache's ranges, a cache-dit mask of 1s and 0s) skip what they would on real ones. Each
hook needs the diffusers that first shipped it (`NEEDS_DIFFUSERS`); a spec for one the installed diffusers lacks
is an error naming the version.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from sagegen.patch import cachedit
from sagegen.patch.cache_fields import CacheSpecError, Field, number, parse_fields

KINDS = ("fbcache", "taylorseer", "magcache", "pab", "fastercache", "seacache", "cachedit")
# Kinds that decide from the denoiser's outputs on each rank (FirstBlockCache's first-block residual; cache-dit's and
# SeaCache's differences synchronise only under their own parallel setups). Under a sequence split each rank sees
# its shard, so ranks could skip different blocks and the next collective would mismatch or hang. The others follow
# a schedule fixed by the step (TaylorSeer, PAB, FasterCache, MagCache from a calibrated file).
DECIDES_PER_RANK = ("fbcache", "seacache", "cachedit")
# the first diffusers with each hook (checked on the released wheels); cache-dit itself requires diffusers >= 0.36
NEEDS_DIFFUSERS = {"taylorseer": (0, 36), "magcache": (0, 37), "seacache": (0, 41), "cachedit": (0, 36)}
# FasterCache's frequency split needs the denoiser's output layout, and its skip of the unconditional branch a
# guidance batch [uncond, cond] in one call: the families that have both (Wan guides in two calls, HunyuanVideo
# is guidance-distilled and its blocks fail the hook, Flux and LTX-Video pack their latents into tokens)
FASTERCACHE_LAYOUTS = {"cogvideox": "BFCHW", "mochi": "BCFHW"}
SEACACHE_FAMILIES = ("wan",)  # diffusers' built-in SEA indicator: Wan text-to-video (and Cosmos 3)

# name -> (the field a bare value sets, the fields, usage)
_GRAMMARS = {
    "taylorseer": ("interval", {"interval": Field(3, low=1), "order": Field(1, low=1), "warmup": Field(3)},
                   "interval:N,order:K,warmup:W"),
    "fastercache": ("spatial", {"spatial": Field(2, low=1), "uncond": Field(5, low=1)}, "spatial:N,uncond:M"),
    "seacache": ("threshold", {"threshold": Field(0.25, integer=False, low_open=True),
                               "order": Field(1, choices=(0, 1)), "warmup": Field(1), "end": Field(1),
                               "max_consecutive": Field(2)},
                 "threshold:T,order:0|1,warmup:W,end:E,max_consecutive:M"),
    "cachedit": ("threshold", {"Fn": Field(8, low=1), "Bn": Field(0), "threshold": Field(0.08, integer=False,
                                                                                        low_open=True),
                               "warmup": Field(8), "max_cached": Field(None), "max_continuous": Field(None),
                               "mask": Field(None), "policy": Field(None, choices=("dynamic", "static")),
                               "taylorseer": Field(None, low=1)},
                 "Fn:N,Bn:N,threshold:T,warmup:W,max_cached:N,max_continuous:N,mask:NAME|1010..,"
                 "policy:dynamic|static,taylorseer:K"),
}
_USAGE = ("write one of fbcache=THRESHOLD, taylorseer=INTERVAL (or interval:N,order:K,warmup:W), magcache=FILE, "
          "pab=STEPS, fastercache=STEPS (or spatial:N,uncond:M), seacache=THRESHOLD (or threshold:T,...), "
          "cachedit=Fn:N,Bn:N,threshold:T,warmup:W")

__all__ = ["KINDS", "CacheSpec", "CacheSpecError", "parse", "check_steps", "bind_steps", "build", "apply",
           "remove"]


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
        return f"{self.kind}=" + ",".join(f"{k}:{v}" for k, v in self.params if k != "steps" or self.kind != "cachedit")


def _diffusers_release() -> tuple[int, ...] | None:
    from importlib import metadata

    try:
        return cachedit.release(metadata.version("diffusers"))
    except metadata.PackageNotFoundError:
        return None


def _check_available(kind: str, text: str) -> None:
    """The installed diffusers (and for cachedit, cache-dit) has the cache ``kind`` names."""
    need = NEEDS_DIFFUSERS.get(kind)
    have = _diffusers_release()
    if need is not None and have is not None and have < need:
        what = "cache-dit" if kind == "cachedit" else f"its {kind} hook"
        raise CacheSpecError(f"{text!r}: {what} needs diffusers >= {'.'.join(map(str, need))}; this is diffusers "
                             f"{'.'.join(map(str, have))}")
    if kind == "cachedit":
        version = cachedit.installed_version()
        if version is None:
            raise CacheSpecError(f"{text!r}: cache-dit is not installed ({cachedit.INSTALL})")
        if cachedit.release(version) < cachedit.MIN_VERSION:
            raise CacheSpecError(f"{text!r}: cache-dit {version} is older than "
                                 f"{'.'.join(map(str, cachedit.MIN_VERSION))} ({cachedit.INSTALL})")


def check_parallel(spec: CacheSpec, sequence_split: bool) -> None:
    """CacheSpecError when ``spec`` would let the ranks of a sequence split (Ulysses, Ring) decide apart
    (`DECIDES_PER_RANK`); CFG parallelism alone is fine: its ranks run whole calls and meet only after them."""
    if sequence_split and spec.kind in DECIDES_PER_RANK:
        raise CacheSpecError(f"{spec.kind} decides from each rank's own part of the sequence under ulysses/ring, so "
                             "the ranks could skip different blocks; use a fixed schedule (taylorseer, pab, magcache, "
                             "fastercache) or --cp cfg=2 alone")


def parse(text: str) -> CacheSpec:
    """``fbcache=0.08`` / ``taylorseer=3`` / ``taylorseer=interval:3,order:2,warmup:3`` / ``magcache=FILE`` /
    ``pab=2`` / ``fastercache=2`` / ``seacache=0.25`` / ``cachedit=Fn:1,Bn:0,threshold:0.08`` -> CacheSpec;
    CacheSpecError naming what is wrong otherwise."""
    kind, sep, rest = text.strip().partition("=")
    kind = kind.strip().lower()
    if kind not in KINDS or not sep or not rest.strip():
        raise CacheSpecError(f"{text!r}: {_USAGE}")
    rest = rest.strip()
    if kind == "fbcache":
        return CacheSpec(kind, (("threshold", number(rest, "fbcache")),))
    if kind == "pab":
        return CacheSpec(kind, (("skip", number(rest, "pab", integer=True, low=1, low_open=False)),))
    if kind == "magcache":
        _check_available(kind, text)
        path = Path(rest).expanduser()
        if not path.is_file():
            raise CacheSpecError(f"magcache={rest!r}: no such file (a JSON list of magnitude ratios, one per step, "
                                 "from a MagCache calibration)")
        ratios = _ratios(path)
        return CacheSpec(kind, (("file", str(path)), ("steps", len(ratios))))
    main, fields, usage = _GRAMMARS[kind]
    params = parse_fields(kind, rest, fields, main, usage, free=frozenset({"mask"}))
    spec = CacheSpec(kind, params)
    if kind == "cachedit" and spec.get("policy") is not None and spec.get("mask") is None:
        raise CacheSpecError(f"{text!r}: policy:{spec.get('policy')} applies to a mask: give mask:NAME or mask:1010..")
    if kind == "cachedit" and spec.get("mask") is not None:
        problem = cachedit.mask_problem(spec.get("mask"), None)
        if problem:
            raise CacheSpecError(f"cachedit {problem}")
    _check_available(kind, text)
    return spec


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
    """A MagCache file was calibrated for a number of steps, a cache-dit mask is written for one: another count
    would misalign them."""
    if spec is not None and spec.kind == "magcache" and spec.get("steps") != steps:
        raise CacheSpecError(f"magcache file {spec.get('file')!r} holds {spec.get('steps')} ratios, for "
                             f"{spec.get('steps')} steps; this run has {steps}: calibrate again at {steps} steps")
    if spec is not None and spec.kind == "cachedit" and spec.get("mask") is not None:
        problem = cachedit.mask_problem(spec.get("mask"), steps)
        if problem:
            raise CacheSpecError(f"cachedit {problem}")


def bind_steps(spec: CacheSpec | None, steps: int) -> CacheSpec | None:
    """`check_steps`, then ``spec`` with the run's step count where its schedule is built from it (a cache-dit
    mask)."""
    check_steps(spec, steps)
    if spec is None or spec.kind != "cachedit" or spec.get("mask") is None:
        return spec
    return CacheSpec(spec.kind, tuple((k, v) for k, v in spec.params if k != "steps") + (("steps", steps),))


def _current_timestep(pipe):
    if pipe is None:
        raise ValueError("this cache needs the pipeline (its current timestep)")
    return lambda: getattr(pipe, "current_timestep", None) or getattr(pipe, "_current_timestep")


def build(spec: CacheSpec, model=None, pipe=None):
    """diffusers' config for ``spec`` on the denoiser ``model`` (TaylorSeer: the model's own attention modules;
    FasterCache, SeaCache: what the model supports; ``pipe``: for the timestep PAB and FasterCache read)."""
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
    if spec.kind == "fastercache":
        return diffusers.FasterCacheConfig(spatial_attention_block_skip_range=spec.get("spatial"),
                                           unconditional_batch_skip_range=spec.get("uncond"),
                                           tensor_format=_fastercache_layout(model),
                                           current_timestep_callback=_current_timestep(pipe))
    if spec.kind == "seacache":
        _check_seacache(model)
        return diffusers.SeaCacheConfig(threshold=spec.get("threshold"), residual_order=spec.get("order"),
                                        retention_steps=spec.get("warmup"), cache_end_steps=spec.get("end"),
                                        max_consecutive_cached=spec.get("max_consecutive"))
    if spec.kind == "pab":
        return diffusers.PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=spec.get("skip"),
                                                         current_timestep_callback=_current_timestep(pipe))
    raise ValueError(f"{spec.kind} is not a diffusers cache hook")


def check_family(spec: CacheSpec | None, family: str) -> None:
    """The caches that serve some model families only, checked on the preset's family before it loads."""
    if spec is None:
        return
    if spec.kind == "fastercache" and family not in FASTERCACHE_LAYOUTS:
        raise CacheSpecError(f"fastercache needs a denoiser that takes guidance as one batched call with video "
                             f"latents ({', '.join(FASTERCACHE_LAYOUTS)}); this model is {family}")
    if spec.kind == "seacache" and family not in SEACACHE_FAMILIES:
        raise CacheSpecError(f"seacache: diffusers has its indicator for Wan text-to-video only; this model is "
                             f"{family}")


def _fastercache_layout(model) -> str:
    from sagegen.patch.targets import family_of

    family = family_of(model) if model is not None else None
    if family not in FASTERCACHE_LAYOUTS:
        raise ValueError(f"fastercache needs a denoiser that takes guidance as one batched call with video latents "
                         f"({', '.join(FASTERCACHE_LAYOUTS)}); {type(model).__name__} is not one")
    return FASTERCACHE_LAYOUTS[family]


def _check_seacache(model) -> None:
    config = getattr(model, "config", None)
    family_ok = model is not None and type(model).__name__ == "WanTransformer3DModel"
    if not family_ok or getattr(config, "in_channels", None) != getattr(config, "out_channels", None):
        raise ValueError(f"seacache: diffusers has its indicator for Wan text-to-video only (a WanTransformer3DModel "
                         f"with as many input as output channels); not {type(model).__name__}")


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


@dataclasses.dataclass
class Applied:
    """A cache `apply` put on a pipeline: what `remove` takes off, and cache-dit's own record of its steps."""
    spec: CacheSpec
    pipe: object
    models: list

    def cached_steps(self) -> list[dict] | None:
        return cachedit.cached_steps(self.pipe) if self.spec.kind == "cachedit" else None


def apply(pipe, spec: CacheSpec) -> Applied:
    """Enable ``spec`` on ``pipe``: diffusers' ``enable_cache`` on every denoiser, or cache-dit on the pipeline."""
    from sagegen.patch.targets import denoisers

    models = list(denoisers(pipe)[0].values())
    if spec.kind == "cachedit":
        cachedit.enable(pipe, spec)
        return Applied(spec, pipe, models)
    done = []
    try:
        for model in models:
            model.enable_cache(build(spec, model, pipe))
            done.append(model)
    except Exception:
        for model in done:  # a model the cache refused leaves none of them cached
            model.disable_cache()
        raise
    return Applied(spec, pipe, models)


def remove(applied: Applied) -> None:
    """Disable the cache `apply` enabled."""
    if applied.spec.kind == "cachedit":
        cachedit.disable(applied.pipe)
        return
    for model in applied.models:
        model.disable_cache()
