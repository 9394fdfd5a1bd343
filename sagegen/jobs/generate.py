"""The generation loop behind `sagegen run` and `sagegen compare`.

A `Job` (model preset, settings, samples, variants, run directory) is run by `run_job`: it records the
manifest, loads the pipeline once, and for each variant (``sdpa``: stock attention; ``sage``: patched with
sagegen's kernels) generates this process's unfinished samples, timing each pipeline call split into
text encoding, denoising and decoding, and saving lossless frames plus a viewing copy (see `sagegen.runs.directory`).
Nothing here prints: progress goes to a `Reporter`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from sagegen.jobs import ranks as distributed
from sagegen.config import DIFFUSION_CONFIG, SageConfig
from sagegen.runs.manifest import (RunDirConflict, _jsonable, build_manifest, check_samples, expected_fingerprints,  # noqa: F401 (re-exported)
                                   merge_manifest)
from sagegen.models.presets import Preset
from sagegen.runs.directory import DamagedFile, RunDir, runs_root

VARIANTS = ("sdpa", "sage")
class BadPolicy(ValueError):
    """The precision policy does not fit the model (e.g. a block index out of range)."""


@dataclass(frozen=True)
class Sample:
    id: str
    prompt: str
    seed: int

    def to_dict(self) -> dict:
        return {"id": self.id, "prompt": self.prompt, "seed": self.seed}


def make_samples(prompts: Sequence[str], seeds: Sequence[int]) -> list[Sample]:
    """Every prompt with every seed, ids ``p<prompt index>-s<seed>``."""
    return [Sample(f"p{i:03d}-s{seed}", p, int(seed)) for i, p in enumerate(prompts) for seed in seeds]


@dataclass
class Job:
    preset: Preset
    settings: dict            # steps, frames, height, width, guidance, negative_prompt, dtype, ...
    samples: list[Sample]
    variants: list[str]
    out: Path | None = None   # None: runs/<model>-<hash of settings>
    sage_config: SageConfig = DIFFUSION_CONFIG  # frozen, so sharing the default is safe
    policy: Any = None        # sagegen.PrecisionPolicy (None: the patcher's default, all quantized)
    backend: str = "auto"     # sageattn backend for the patcher: auto | triton | reference
    linear: str | None = None  # the sage variant's linears: None (bf16, as the model) or "fp8"
    device: str = "auto"
    offload: str = "none"
    compile: bool = False
    cuda_graphs: bool = False  # every variant's denoiser calls replayed as CUDA graphs (sagegen.patch.graphs)
    warmup: int = 1           # untimed warm-up calls per variant (Triton / torch.compile / autotuning)
    model_path: str | None = None
    command: list[str] = field(default_factory=list)
    sparse: Any = None        # sagegen.SparseConfig (None: dense attention)

    def digest(self) -> str:
        key = {"model": self.preset.name, "settings": self.settings, "samples": [s.to_dict() for s in self.samples],
               "model_path": self.model_path, "sage": self.sage_config.to_dict(), "policy": _jsonable(self.policy),
               "backend": self.backend}
        if self.linear is not None:  # only then: digests of earlier runs stay the same
            key["linear"] = self.linear
        if self.sparse is not None:  # only then, so dense runs keep their directory names
            key["sparse"] = self.sparse.to_dict()
        return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:8]

    def resolve_out(self) -> Path:
        if self.out is None:
            self.out = runs_root() / f"{self.preset.name}-{self.digest()}"
        return Path(self.out)


class Reporter:
    """Progress callbacks (no-ops here; the CLI draws rich progress bars)."""

    def log(self, message: str) -> None: ...
    def variant_start(self, variant: str, todo: int, total: int) -> None: ...
    def sample_start(self, variant: str, sample: Sample, steps: int) -> None: ...
    def step(self, done: int, total: int) -> None: ...
    def sample_done(self, variant: str, sample: Sample, timings: dict, path: Path) -> None: ...


@dataclass
class RunResult:
    run_dir: Path
    generated: dict[str, int]
    skipped: dict[str, int]
    setup: dict[str, dict]
    manifest: dict | None     # the final manifest (rank 0), None on other ranks


# ----------------------------------------------------------------------------------------------- timing
class _StepClock:
    """Stands in for `pipe.progress_bar`: marks when the denoising loop starts and ends, counts steps."""

    def __init__(self, sync: Callable[[], None], on_step: Callable[[int, int], None]):
        self.sync, self.on_step = sync, on_step
        self.start = self.end = None
        self.total = self.done = 0

    def __call__(self, iterable=None, total=None):
        self.total = total if total is not None else (len(iterable) if iterable is not None else 0)
        if iterable is not None:
            return self._iterate(iterable)
        return self

    def _iterate(self, iterable):
        with self:
            for item in iterable:
                yield item
                self.update()

    def __enter__(self):
        self.sync()
        self.start = time.perf_counter()
        return self

    def update(self, n: int = 1) -> None:
        self.done += n
        self.on_step(self.done, self.total)

    def __exit__(self, *exc) -> None:
        self.sync()
        self.end = time.perf_counter()


def _syncer(device) -> Callable[[], None]:
    import torch

    if getattr(device, "type", None) == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def call_kwargs(preset: Preset, settings: dict, prompt: str) -> dict:
    """The pipeline-call arguments for one sample (without generator/output_type)."""
    kw: dict[str, Any] = {"prompt": prompt, "num_inference_steps": settings["steps"], "height": settings["height"],
                          "width": settings["width"]}
    guidance_arg = getattr(preset, "guidance_arg", "guidance_scale")  # Qwen-Image: true_cfg_scale; None: guider
    if guidance_arg:
        kw[guidance_arg] = settings["guidance"]
    if preset.is_video:
        kw["num_frames"] = settings["frames"]
    if settings.get("negative_prompt"):
        kw["negative_prompt"] = settings["negative_prompt"]
    if settings.get("max_sequence_length"):
        kw["max_sequence_length"] = settings["max_sequence_length"]
    kw.update(preset.call_kwargs)
    return kw


def _to_uint8(output, is_video: bool):
    import numpy as np

    arr = output.frames if is_video else output.images
    arr = arr[0] if is_video else arr
    arr = np.asarray(arr.float().cpu() if hasattr(arr, "cpu") else arr, dtype=np.float32)
    if arr.ndim == 3:  # one image, or a video of one frame
        arr = arr[None]
    if arr.shape[-1] not in (1, 3) and arr.shape[1] in (1, 3):  # channels-first -> last
        arr = np.moveaxis(arr, 1, -1)
    finite = bool(np.isfinite(arr).all())
    arr = np.nan_to_num(arr, nan=0.0, posinf=1.0, neginf=0.0)
    out = np.clip(np.round(arr * 255.0), 0, 255).astype(np.uint8)
    if out.shape[-1] == 1:
        out = np.repeat(out, 3, axis=-1)
    return out, finite


def generate_one(loaded, preset: Preset, settings: dict, sample: Sample, device, *,
                 on_step: Callable[[int, int], None] = lambda d, t: None, steps: int | None = None):
    """Run the pipeline for one sample: (uint8 frames [F, H, W, 3], timings, all values finite?)."""
    import torch

    pipe, sync = loaded.pipe, _syncer(device)
    s = dict(settings, steps=steps or settings["steps"])
    kw = call_kwargs(preset, s, sample.prompt)
    if loaded.call_overrides is not None:
        kw.update(loaded.call_overrides(sample.prompt, sample.seed))
        if "prompt_embeds" in kw:
            kw.pop("prompt", None)
            kw.pop("negative_prompt", None)
    clock = _StepClock(sync, on_step)
    object.__setattr__(pipe, "progress_bar", clock)  # the pipelines' `with self.progress_bar(total=...)`
    try:
        generator = torch.Generator("cpu").manual_seed(sample.seed)  # same noise on every device
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            output = pipe(**kw, generator=generator, output_type="np")
        sync()
        t1 = time.perf_counter()
    finally:
        with contextlib.suppress(AttributeError):
            object.__delattr__(pipe, "progress_bar")
    start = clock.start if clock.start is not None else t0
    end = clock.end if clock.end is not None else t1
    frames, finite = _to_uint8(output, preset.is_video)
    timings = {"total_s": round(t1 - t0, 6), "encode_s": round(start - t0, 6),
               "denoise_s": round(end - start, 6), "decode_s": round(t1 - end, 6)}
    if clock.done:
        timings["step_s"] = round((end - start) / clock.done, 6)
    return frames, timings, finite


# ---------------------------------------------------------------------------------------------- the run
def _patcher():
    try:
        from sagegen.patch import patch, unpatch
    except ImportError as e:
        raise RuntimeError(f"sagegen's pipeline patcher is not available in this checkout ({e}); "
                           "use --attention sdpa or update sagegen") from e
    return patch, unpatch


@contextlib.contextmanager
def attention(pipe, variant: str, job: Job, setup: dict):
    """Patch the pipeline with sagegen's attention for the ``sage`` variant (and undo it after)."""
    if variant != "sage":
        setup["patch_s"] = 0.0
        with _stock_graphs(pipe, job.cuda_graphs, setup):
            yield
        return
    patch, unpatch = _patcher()
    t0 = time.perf_counter()
    kwargs = {"backend": job.backend} if job.policy is None else {"policy": job.policy, "backend": job.backend}
    if job.linear is not None:
        kwargs["linear"] = job.linear
    if job.sparse is not None:
        kwargs["sparse"] = job.sparse
    if job.cuda_graphs:
        kwargs["cuda_graphs"] = True
    # every preset's denoiser is tested with sagegen (tests/test_models_*.py); the classes outside
    # SUPPORTED_MODELS (LTX-Video, Qwen-Image, HunyuanVideo-1.5) take the generic route
    kwargs["allow_generic"] = True
    try:
        patch(pipe, job.sage_config, **kwargs)
    except ValueError as e:  # e.g. a --fp-blocks entry that names no block of this model
        raise BadPolicy(f"cannot patch {job.preset.name} with this precision policy: {e}") from e
    setup["patch_s"] = round(time.perf_counter() - t0, 6)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # how many attention calls sagegen ran, fell back, kept fp
            from sagegen.patch import patch_info

            info = patch_info(pipe)
            setup["attention_calls"] = dict(info.get("stats", {}))
            if info.get("cuda_graphs"):
                setup["cuda_graphs"] = info["cuda_graphs"]
            if info.get("linear"):  # which layers ran FP8 (docs/fp8-linear.md)
                setup["linear"] = {k: info["linear"][k] for k in ("fp8_layer_count", "fp8_calls", "fp8_layers",
                                                                  "emulated", "note", "fp8_weight_bytes_added")}
                if info["linear"]["lora"]["layers"]:  # LoRA bases in FP8 or bf16 and why (docs/lora.md)
                    setup["linear"]["lora"] = info["linear"]["lora"]
        if job.sparse is not None:  # realized block density per step and layer (sagegen.patch.sparse_density)
            with contextlib.suppress(Exception):
                from sagegen.patch import sparse_density

                setup["sparse"] = {"config": job.sparse.to_dict(), "density": sparse_density(pipe)}
        unpatch(pipe)


@contextlib.contextmanager
def step_cache(pipe, spec: dict | None, setup: dict):
    """The run's step cache (``--cache``) on the pipeline's denoisers for one variant, with a recorder of what it
    computed per denoiser call (``setup["cache"]``); removed after. Yields the recorder (None without a cache):
    clearing its ``calls`` leaves warm-up calls out of the record."""
    if spec is None:
        yield None
        return
    from sagegen.patch import cache_spec
    from sagegen.patch.cache_schedule import ScheduleRecorder
    from sagegen.patch.targets import denoisers

    recorder = ScheduleRecorder(list(denoisers(pipe)[0].values()))  # first: the innermost hooks
    try:
        applied = cache_spec.apply(pipe, cache_spec.CacheSpec.from_dict(spec))
    except Exception:
        recorder.remove()
        raise
    try:
        yield recorder
    finally:
        schedule = recorder.summary()
        with contextlib.suppress(Exception):  # cache-dit's own record: the last generation's cached steps
            cached = applied.cached_steps()
            if cached is not None:
                schedule["cachedit"] = cached
        setup["cache"] = {"spec": spec, "schedule": schedule}
        cache_spec.remove(applied)
        recorder.remove()


@contextlib.contextmanager
def _nested(outer, inner):
    with outer, inner:
        yield


@contextlib.contextmanager
def _stock_graphs(pipe, enabled: bool, setup: dict):
    """The stock variant's denoisers under the same CUDA-graph wrapper as the patched ones (a fair timing)."""
    if not enabled:
        yield
        return
    from sagegen.patch import graphs
    from sagegen.patch.targets import denoisers

    models = list(denoisers(pipe)[0].values())
    for model in models:
        graphs.enable(model)
    try:
        yield
    finally:
        setup["cuda_graphs"] = graphs.info(models[0])  # graphs, failed captures, eager/replayed calls
        for model in models:
            graphs.disable(model)


def _compile(pipe) -> None:
    import torch

    torch._dynamo.reset()  # forget graphs traced with the other attention
    pipe.transformer.compile()


def default_loader(job: Job, device):
    from sagegen.models import loading

    s = job.settings
    return loading.load(job.preset, dtype=s["dtype"], device=device, model_path=job.model_path,
                        random_weights=bool(s.get("random_weights")), offload=job.offload,
                        vae_tiling=bool(s.get("vae_tiling")), vae_slicing=bool(s.get("vae_slicing")))


def run_job(job: Job, reporter: Reporter | None = None, *, dist: distributed.DistInfo | None = None,
            loader: Callable | None = None) -> RunResult:
    """Generate every unfinished sample of this process's share into the run directory."""
    reporter = reporter or Reporter()
    dist = dist or distributed.info()
    device = distributed.device_for(job.device, dist)
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)  # one GPU per process: kernels and allocations stay on it
    rd = RunDir(job.resolve_out())
    new = build_manifest(job, dist, device)
    planned = new
    if rd.exists():
        try:
            current = rd.manifest
        except DamagedFile as e:  # like a different run in that folder: the user picks what to do (exit 2)
            raise RunDirConflict(str(e)) from None
        planned = merge_manifest(current, new, rd.path)  # refuse a conflicting run before loading anything
    # every sample already there must be this run's (identity), inside the folder (containment); damaged ones
    # are redone (integrity)
    redo = check_samples(rd, planned, adopting=not rd.exists())
    for where, why in redo.items():
        reporter.log(f"redoing {where}: {why}")
    cp = job.settings.get("cp")  # context parallelism: every process runs every sample, rank 0 writes it
    mine = list(job.samples) if cp else distributed.shard(job.samples, dist)
    todo = {v: [s for s in mine if not rd.finished(v, s.id)] for v in job.variants}
    result = RunResult(rd.path, {v: 0 for v in job.variants}, {v: len(mine) - len(todo[v]) for v in job.variants},
                       {}, None)
    # Load first: when the weights are missing, fail without leaving an empty run directory behind.
    loaded = (loader or default_loader)(job, device) if any(todo.values()) else None
    rd.update_manifest(lambda cur: merge_manifest(cur, new, rd.path))
    if loaded is not None:
        reporter.log(f"loaded {job.preset.name} from {loaded.source} in {loaded.load_s:.1f} s")
        lora_setup = None
        if job.settings.get("lora"):  # before any variant: stock and sagegen run the same adapters
            from sagegen.jobs import adapters

            lora_setup = adapters.load(loaded.pipe, job.settings["lora"])
            reporter.log(f"loaded {len(lora_setup['adapters'])} LoRA(s) into {lora_setup['layers']} layers")
        for note in loaded.info.get("notes", []):
            reporter.log(note)
        load_s = round(loaded.load_s, 6)  # charged to the first variant that runs
        if cp:
            from sagegen.jobs.cp_pipeline import enable_pipeline_cp

            cp_backend = enable_pipeline_cp(loaded.pipe, cp, backend=job.backend, config=job.sage_config,
                                            guidance=job.settings.get("guidance"))
        for variant in job.variants:
            reporter.variant_start(variant, len(todo[variant]), len(mine))
            if not todo[variant]:
                continue
            setup = {"load_s": load_s, "source": loaded.source}
            if lora_setup is not None:
                setup["lora"] = lora_setup
            load_s = 0.0
            if cp:
                from sagegen.jobs.cp_pipeline import cp_variant

                context = cp_variant(loaded.pipe, variant, cp, device, cp_backend, setup)
                if variant == "sage":  # the patch too (fused prologues and blocks, FP8 linears), on its ranks
                    context = _nested(context, attention(loaded.pipe, variant, job, setup))
            else:
                context = attention(loaded.pipe, variant, job, setup)
            # the step cache inside the patch: both orders work, and the schedule is read before unpatching
            context = _nested(context, step_cache(loaded.pipe, job.settings.get("cache"), setup))
            with context:
                _run_variant(job, loaded, variant, todo[variant], device, rd, reporter, setup, result, dist.rank,
                             expected_fingerprints(planned),
                             write=dist.is_main or not cp)
            result.setup[variant] = setup
            key = f"rank{dist.rank}"
            rd.update_manifest(lambda cur: _with_setup(cur, variant, key, setup))
    else:
        for variant in job.variants:
            reporter.variant_start(variant, 0, len(mine))
    distributed.barrier(dist)
    if dist.is_main:
        result.manifest = rd.refresh_manifest()
    return result


def _with_setup(manifest: dict, variant: str, key: str, setup: dict) -> dict:
    manifest.setdefault("setup", {}).setdefault(variant, {})[key] = setup
    return manifest


def _run_variant(job, loaded, variant, samples, device, rd, reporter, setup, result, rank, fingerprints,
                 write=True) -> None:
    if job.compile:
        t0 = time.perf_counter()
        _compile(loaded.pipe)
        setup["compile_s"] = round(time.perf_counter() - t0, 6)
    t0 = time.perf_counter()
    for _ in range(max(0, job.warmup)):  # untimed: JIT compilation, autotuning, allocator warm-up
        generate_one(loaded, job.preset, job.settings, samples[0], device, steps=min(2, job.settings["steps"]))
    setup["warmup_s"] = round(time.perf_counter() - t0, 6)
    if variant == "sage":  # count the attention calls of the timed samples only
        with contextlib.suppress(Exception):
            from sagegen.patch import reset_stats

            reset_stats(loaded.pipe)
    for sample in samples:
        reporter.sample_start(variant, sample, job.settings["steps"])
        frames, timings, finite = generate_one(loaded, job.preset, job.settings, sample, device,
                                               on_step=reporter.step)
        if not write:  # context parallelism: this rank computed its share of rank 0's sample
            continue
        record = {**sample.to_dict(), "fingerprint": fingerprints[(variant, sample.id)], "timings": timings,
                  "rank": rank}
        if not finite:
            record["nonfinite"] = True  # NaN/inf in the decoded output (written as 0)
        path = rd.write_sample(variant, record, frames, kind=job.preset.kind, fps=job.preset.fps)
        rd.update_manifest(lambda cur: cur)
        result.generated[variant] += 1
        reporter.sample_done(variant, sample, rd.sample(variant, sample.id)["timings"], path)
