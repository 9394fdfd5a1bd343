"""Compute the requested metrics for a run directory and write ``metrics.json`` (atomically, merged with
any metrics already there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from sagegen.eval import METRICS
from sagegen.eval import stats
from sagegen.eval.metricsfile import SCHEMA, now_iso, write_metrics  # noqa: F401 (SCHEMA re-exported)
from sagegen.runs.reader import Run, load_frames, load_run
from sagegen.eval.setmetrics import SET_METRICS, set_metric
from sagegen.eval.weights import BadOption, WeightsMissing

CLIP_METRICS = ("clipsim", "clipt", "clipscore")
PAIRED_METRICS = ("psnr", "ssim", "lpips")
VIDEO_ONLY = ("clipsim", "clipt")
IMAGE_ONLY = ("clipscore",)
INFO = {  # higher_is_better, unit, description
    "clipsim": (True, "cos", "CLIP similarity of each frame to the prompt, averaged over frames"),
    "clipt": (True, "cos", "CLIP similarity of consecutive frames, averaged"),
    "clipscore": (True, "100·cos", "CLIPScore: 100·max(cos(image, prompt), 0) with the prompt as given"),
    "fid": (False, "", "Fréchet Inception Distance of the candidate set to the baseline set (and reference)"),
    "kid": (False, "", "Kernel Inception Distance (unbiased MMD², cubic kernel)"),
    "psnr": (True, "dB", "PSNR vs the baseline frame (lossless PNGs), mean over frames"),
    "ssim": (True, "", "SSIM vs the baseline frame (Gaussian 11x11, σ=1.5; per RGB channel over the valid region, "
                       "no downsampling), mean over frames"),
    "lpips": (False, "", "LPIPS (AlexNet, v0.1) vs the baseline frame, mean over frames"),
}


CLIPSCORE_CONVENTION = ("torchmetrics' CLIPScore, 100·max(cos, 0) with the prompt as given; not Hessel et al.'s "
                        "2.5·max(cos, 0) with \"A photo depicts\" prepended")


def parse_metrics(names: Iterable[str], kind: str | None = None) -> list[str]:
    """``--metric`` values (repeatable, comma-separated allowed, ``all``) -> ordered metric names.
    No value means ``all``: every metric that applies to the run's kind of model."""
    names = list(names)
    if not any(str(n).strip(" ,") for n in names):
        names = ["all"]
    want: list[str] = []
    for raw in names:
        for piece in str(raw).split(","):
            n = piece.strip().lower().replace("-", "").replace("_", "")
            if not n:
                continue
            if n == "all":
                want.extend(m for m in METRICS if not _not_applicable(m, kind))
            elif n in METRICS:
                want.append(n)
            else:
                raise BadOption(f"--metric: unknown metric {piece.strip()!r}; choose from {', '.join(METRICS)}, or all")
    return list(dict.fromkeys(want))


def not_applicable(kind: str | None) -> dict[str, str]:
    """Metrics that ``all`` leaves out for this kind of model, with the reason."""
    return {m: why for m in METRICS if (why := _not_applicable(m, kind))}


def _not_applicable(metric: str, kind: str | None) -> str | None:
    if kind == "image" and metric in VIDEO_ONLY:
        return f"{metric} is for video models (this run's model makes images); use clipscore"
    if kind == "video" and metric in IMAGE_ONLY:
        return "clipscore is for image models (this run's model makes video); use clipsim"
    return None


@dataclass
class EvalOptions:
    metrics: list[str]
    clip_model: str | None = None
    clip_mode: str = "evalcrafter"
    inception_weights: str | None = None
    lpips_weights: str | None = None
    reference: Path | None = None
    fid_frames_per_sample: int | None = None  # None: every frame
    loaders: dict[str, Callable[[], Any]] = field(default_factory=dict)  # tests inject stand-ins here


def _even_subset(n: int, k: int | None) -> np.ndarray:
    if k is None or k >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(int))


def _load_reference(folder: Path) -> list[np.ndarray]:
    from sagegen.runs.reader import load_frame

    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))
    if len(paths) < 2:
        raise BadOption(f"--reference {folder}: needs at least 2 images (*.png, *.jpg, *.webp), found {len(paths)}")
    return [load_frame(p)[None] for p in paths]


def _default_loaders(opts: EvalOptions) -> dict[str, Callable[[], Any]]:
    from sagegen.eval import clip as clipmod
    from sagegen.eval import fid as fidmod
    from sagegen.eval import fidelity
    from sagegen.eval import weights

    return {
        "clip": lambda: clipmod.load_clip(weights.resolve_clip(opts.clip_model)),
        "inception": lambda: fidmod.load_inception(weights.resolve_inception(opts.inception_weights)),
        "lpips": lambda: fidelity.load_lpips(weights.resolve_lpips(opts.lpips_weights)),
    }


def evaluate(run_dir: str | Path, opts: EvalOptions, log: Callable[[str], None] = print) -> dict:
    from sagegen.eval import clip as clipmod
    from sagegen.eval import fidelity

    if opts.clip_mode not in clipmod.MODES:
        raise BadOption(f"--clip-mode must be one of {', '.join(clipmod.MODES)}; got {opts.clip_mode!r}")
    run = load_run(run_dir, log=log)
    loaders = {**_default_loaders(opts), **opts.loaders}
    results: dict[str, dict] = {}
    weights_missing: set[str] = set()
    todo: list[str] = []
    for m in parse_metrics(opts.metrics, run.kind):
        why = _not_applicable(m, run.kind)
        if why:
            results[m] = {"status": "skipped", "reason": why}
        else:
            todo.append(m)

    models: dict[str, Any] = {}
    needs = {"clip": [m for m in todo if m in CLIP_METRICS], "inception": [m for m in todo if m in SET_METRICS],
             "lpips": [m for m in todo if m == "lpips"]}
    for key, ms in needs.items():
        if not ms:
            continue
        try:
            models[key] = loaders[key]()
        except WeightsMissing as e:
            for m in ms:
                results[m] = {"status": "skipped", "reason": str(e)}
            weights_missing.update(ms)
        except ModuleNotFoundError as e:  # an optional package: skipped as missing weights are, with the fix
            for m in ms:
                results[m] = {"status": "skipped", "reason": f"{e.name or e} is not installed: pip install "
                              "'sagegen[eval]' (open-clip-torch, torchvision, scipy)"}
            weights_missing.update(ms)
        except BadOption:
            raise
        except Exception as e:  # a broken weights file: the other metrics still run
            for m in ms:
                results[m] = {"status": "error", "reason": f"could not load {key} weights: {type(e).__name__}: {e}"}
    todo = [m for m in todo if m not in results]

    reference = _load_reference(Path(opts.reference)) if opts.reference and set(todo) & set(SET_METRICS) else None
    per: dict[str, dict[str, dict[str, dict]]] = {m: {} for m in todo}  # metric -> variant -> sample -> entry
    sample_errors: dict[str, dict[str, dict[str, str]]] = {m: {} for m in todo}  # metric -> variant -> sample
    feats: dict[str, list[np.ndarray]] = {v: [] for v in run.variants}
    feat_samples: list[str] = []
    failed: dict[str, str] = {}  # set metrics: one failing sample spoils the whole set

    def record(metric: str, variant: str, sid: str, fn: Callable[[], dict]) -> None:
        # one bad sample (e.g. a pair with different frame counts) is that sample's error, not the metric's
        try:
            per[metric].setdefault(variant, {})[sid] = fn()
        except Exception as e:
            sample_errors[metric].setdefault(variant, {})[sid] = f"{type(e).__name__}: {e}"

    per_sample = [m for m in todo if m not in SET_METRICS]
    for (v, sid), why in run.left_out.items():  # not whole or not this run's: each metric names it, no mean has it
        for m in per_sample:
            sample_errors[m].setdefault(v, {})[sid] = f"left out: {why}"
    for i, s in enumerate(run.samples):
        log(f"  [{i + 1}/{len(run.samples)}] {s.id}")
        try:
            frames = {v: load_frames(s.frame_paths(v)) for v in run.variants}
        except (OSError, ValueError) as e:  # a frame that does not decode: this sample's error, not the run's
            for m in per_sample:
                sample_errors[m].setdefault(run.baseline, {})[s.id] = f"a frame cannot be read: {type(e).__name__}: {e}"
            for m in SET_METRICS:
                if m in todo:
                    failed.setdefault(m, f"a frame of sample {s.id} cannot be read ({type(e).__name__}: {e})")
            continue
        base = frames[run.baseline]
        for v in run.variants:
            fr = frames[v]
            if "clipsim" in todo:
                record("clipsim", v, s.id, lambda: _series(
                    clipmod.frame_text_similarities(models["clip"], fr, s.prompt, opts.clip_mode)))
            if "clipt" in todo:
                record("clipt", v, s.id, lambda: _series(
                    clipmod.consecutive_similarities(models["clip"], fr, opts.clip_mode)))
            if "clipscore" in todo:
                record("clipscore", v, s.id, lambda: {"value": clipmod.clipscore(models["clip"], fr[0], s.prompt)})
            if set(todo) & set(SET_METRICS) and "inception" in models:
                try:
                    feats[v].append(models["inception"](fr[_even_subset(len(fr), opts.fid_frames_per_sample)]))
                except Exception as e:
                    for m in SET_METRICS:
                        failed.setdefault(m, f"{type(e).__name__}: {e} (sample {s.id}, variant {v})")
            if v == run.baseline:
                continue
            if "psnr" in todo:
                record("psnr", v, s.id, lambda: _series(fidelity.psnr_frames(fr, base)))
            if "ssim" in todo:
                record("ssim", v, s.id, lambda: _series(fidelity.ssim_frames(fr, base)))
            if "lpips" in todo:
                record("lpips", v, s.id, lambda: _series(fidelity.lpips_frames(models["lpips"], fr, base)))
        feat_samples.append(s.id)

    for m in todo:
        if m in SET_METRICS:
            results[m] = _set_entry(m, run, feats, reference, models.get("inception"), failed, opts)
            results[m].update({"samples": feat_samples, "n_samples": len(feat_samples),
                               "frames_per_sample": opts.fid_frames_per_sample,
                               "reference": str(opts.reference) if reference is not None else None})
        else:
            results[m] = _per_sample_entry(m, run, per[m], sample_errors[m], opts)
        results[m].update({k: v for k, v in _meta(m, opts, models).items() if k not in results[m]})
    stamp = now_iso()
    for entry in results.values():
        entry["evaluated"] = stamp
    call = {"evaluated": stamp, "requested": list(results),
            "computed": [m for m, e in results.items() if e.get("status") == "ok"]}
    return write_metrics(run, results, keep_if_ok=weights_missing, log=log, call=call)


def _set_entry(metric: str, run: Run, feats: dict, reference, extractor, failed: dict, opts: EvalOptions) -> dict:
    """FID/KID, or an error entry: a metric that cannot be computed must not stop the others being written."""
    from sagegen.eval import fid as fidmod

    if metric in failed:
        return {"status": "error", "reason": failed[metric]}
    try:
        ref = fidmod.features_of(extractor, reference) if reference is not None else None
        return set_metric(metric, run.baseline, run.candidates, feats, ref, extractor)
    except Exception as e:
        return {"status": "error", "reason": f"{type(e).__name__}: {e}"}


def _per_sample_entry(metric: str, run: Run, per: dict, errors: dict[str, dict[str, str]],
                      opts: EvalOptions) -> dict:
    flat = [(sid, v, msg) for v, by_sid in errors.items() for sid, msg in by_sid.items()]
    if not any(per.values()):  # nothing computed at all: the metric failed
        sid, v, msg = flat[0] if flat else ("?", "?", "no sample computed")
        more = f"; {len(flat) - 1} more sample(s) failed" if len(flat) > 1 else ""
        return {"status": "error", "reason": f"{msg} (sample {sid}, variant {v}){more}"}
    out = _aggregate(metric, run, per, opts)
    used = {sid for by_sid in per.values() for sid in by_sid}
    ids = [s.id for s in run.samples if s.id in used]
    prompts = {s.prompt for s in run.samples if s.id in used}
    out.update({"samples": ids, "n_samples": len(ids),
                "interval": {"method": stats.METHOD, "level": stats.CI_LEVEL,
                             "over": "prompts" if len(prompts) < len(ids) else "samples"}})
    if flat:
        out["sample_errors"] = errors
        shown = "; ".join(f"{sid} ({v}): {msg}" for sid, v, msg in flat[:3])
        out["warning"] = (f"{len(flat)} sample(s) failed and are left out of the mean: {shown}"
                          + (" ..." if len(flat) > 3 else ""))
    return out


def _series(values: list[float]) -> dict:
    return {"value": float(np.mean(values)), "per_frame": [float(x) for x in values]}


def _meta(metric: str, opts: EvalOptions, models: dict) -> dict:
    from sagegen.eval import clip as clipmod

    hib, unit, desc = INFO[metric]
    meta: dict[str, Any] = {"higher_is_better": hib, "unit": unit, "description": desc}
    if metric in CLIP_METRICS and "clip" in models:
        meta["model"] = models["clip"].label
        mode = "standard" if metric == "clipscore" else opts.clip_mode
        meta["mode"] = mode
        notes = []
        if mode == "evalcrafter" and not models["clip"].is_evalcrafter_model:
            notes.append("EvalCrafter preprocessing with a model other than OpenAI ViT-B/32: not comparable to "
                         "EvalCrafter")
        if metric == "clipsim" and mode == "evalcrafter" and not clipmod.has_exact_resize():
            notes.append(clipmod.APPROX_RESIZE_NOTE)
        if metric == "clipscore":  # two conventions share the name; say which one this number follows
            notes.append(CLIPSCORE_CONVENTION)
        if notes:
            meta["note"] = "; ".join(notes)
    if metric == "psnr":
        meta["psnr_cap_db"] = 100.0
    return meta


def _aggregate(metric: str, run: Run, per: dict[str, dict[str, dict]], opts: EvalOptions) -> dict:
    paired = metric in PAIRED_METRICS
    out: dict[str, Any] = {"status": "ok", "kind": "paired" if paired else "per_variant", "per_sample": per}
    prompt = {s.id: s.prompt for s in run.samples}  # seeds of one prompt are one cluster, not independent
    agg = {}
    for v, samples in per.items():
        agg[v] = stats.mean_ci([e["value"] for e in samples.values()], groups=[prompt[i] for i in samples])
    out["aggregate"] = agg
    if not paired:
        deltas = {}
        base = per.get(run.baseline, {})
        for c in run.candidates:
            ids = [sid for sid in per.get(c, {}) if sid in base]
            deltas[c] = stats.paired_delta_ci(
                [per[c][i]["value"] for i in ids], [base[i]["value"] for i in ids], groups=[prompt[i] for i in ids]
            )
        out["delta"] = deltas
    return out
