"""cache-dit (``pip install sagegen[cachedit]``) as a ``--cache`` kind: its DBCache on a pipeline, configured
from a ``cachedit=...`` spec, and the steps it answered from its cache.

cache-dit wraps the pipeline (its class's ``__call__`` opens a fresh cache context per generation) and the
denoiser's ``forward`` (during each call the block lists are swapped for one module that always runs the first Fn
and last Bn blocks and decides, from the change of the first blocks' residual, whether to run the others). It
checks each block's ``forward`` signature against its patterns and calls the blocks as modules: the fused block
classes of `sagegen.patch` keep the stock signature (`fusion.prologue.forward_subclass`), so they pass the check
and run under cache-dit in either order, with the patch's attention and FP8 linears inside them.
``cache_dit.disable_cache`` and `sagegen.unpatch` each take back only their own part
(tests/patch/test_patch_cachedit.py).
"""

from __future__ import annotations

from importlib import metadata

MIN_VERSION = (1, 5)
INSTALL = "pip install 'sagegen[cachedit]'"
POLICIES = ("slow", "medium", "fast", "ultra")  # cache-dit's named step masks (`cache_dit.steps_mask`)


def installed_version() -> str | None:
    try:
        return metadata.version("cache-dit")
    except metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "1.5.3" -> (1, 5, 3), "0.42.0.dev0" -> (0, 42, 0)."""
    parts = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def mask_problem(mask: str, steps: int | None) -> str | None:
    """Why ``mask`` (a named policy or a 0/1 string per step) cannot serve ``steps`` steps; None if it can."""
    if mask.lower() in POLICIES:
        if steps is not None and steps < 8 and steps not in (4, 6):
            return f"cache-dit's named masks need 4, 6 or >= 8 steps (this run has {steps}): give 0/1 per step"
        return None
    if not mask or set(mask) - {"0", "1"} or mask[0] != "1":
        return f"mask:{mask!r} must be one of {', '.join(POLICIES)} or a 0/1 string (1 = compute) starting with 1"
    if steps is not None and len(mask) != steps:
        return f"mask:{mask} has {len(mask)} steps, this run has {steps}"
    return None


def options(spec, steps: int | None = None) -> dict:
    """The keyword arguments of ``cache_dit.enable_cache`` for ``spec`` (``steps``: for a named mask)."""
    import cache_dit

    get = spec.get
    fields = dict(Fn_compute_blocks=get("Fn"), Bn_compute_blocks=get("Bn"), residual_diff_threshold=get("threshold"),
                  max_warmup_steps=get("warmup"))
    if get("max_cached") is not None:
        fields["max_cached_steps"] = get("max_cached")
    if get("max_continuous") is not None:
        fields["max_continuous_cached_steps"] = get("max_continuous")
    mask = get("mask")
    if mask is not None:
        steps = steps or get("steps")
        if mask.lower() in POLICIES:
            if steps is None:
                raise ValueError(f"cachedit mask:{mask} needs the run's step count")
            bits = cache_dit.steps_mask(total_steps=steps, mask_policy=mask.lower())
        else:
            bits = [int(c) for c in mask]
        fields.update(steps_computation_mask=list(bits), num_inference_steps=len(bits))
        if get("policy") is not None:
            fields["steps_computation_policy"] = get("policy")
    out = {"cache_config": cache_dit.DBCacheConfig(**fields)}
    if get("taylorseer") is not None:
        out["calibrator_config"] = cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=get("taylorseer"))
    return out


def _check_blocks(pipe, spec) -> None:
    """cache-dit asserts Fn and Bn against each block list in the middle of the first call: said here first."""
    from sagegen.patch.precision_policy import main_blocks
    from sagegen.patch.targets import attention_modules, denoisers

    for model in denoisers(pipe)[0].values():
        lists: dict[str, int] = {}
        for name in main_blocks(model, list(attention_modules(model))):
            lists[name.rsplit(".", 1)[0]] = lists.get(name.rsplit(".", 1)[0], 0) + 1
        name, size = min(lists.items(), key=lambda kv: kv[1]) if lists else ("blocks", 0)
        for field in ("Fn", "Bn"):
            if spec.get(field) > size:
                raise ValueError(f"cachedit {field}:{spec.get(field)} is more blocks than {type(model).__name__}'s "
                                 f"`{name}` holds ({size})")


def enable(pipe, spec) -> None:
    """cache-dit's cache on the pipeline ``pipe`` as ``spec`` says."""
    import cache_dit

    name = type(pipe).__name__
    if not any(name.startswith(prefix) for prefix in cache_dit.supported_pipelines()[1]):
        raise ValueError(f"cache-dit {installed_version()} has no adapter for {name}")
    _check_blocks(pipe, spec)
    cache_dit.enable_cache(pipe, **options(spec))


def disable(pipe) -> None:
    import cache_dit

    cache_dit.disable_cache(pipe)


def cached_steps(pipe) -> list[dict]:
    """Per cache context (one per block list and denoiser): the steps of the last generation cache-dit answered
    from its cache, for the conditional calls and (guidance in two calls) the unconditional ones."""
    import cache_dit

    out, seen = [], set()
    for stats in cache_dit.summary(pipe, logging=False):
        name = (getattr(stats, "cache_options", None) or {}).get("name")
        if name is None or name in seen:  # a denoiser's stats and its blocks' name the same context
            continue
        seen.add(name)
        out.append({"context": name, "cached_steps": list(stats.cached_steps),
                    "cfg_cached_steps": list(stats.cfg_cached_steps)})
    return out
