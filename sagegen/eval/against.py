"""``sagegen eval RUN --against OTHER``: paired fidelity (PSNR, SSIM, LPIPS) of every variant of RUN against
every variant of OTHER, sample by sample, where the two runs differ in one setting (a step cache, a LoRA scale, a
sparse policy) and match in everything that decides the pixels otherwise: model, resolution, frames, steps and
each sample's prompt and seed.

The typical check of a step cache: ``sagegen compare M --cache fbcache=0.08 --out runs/cached``, ``sagegen compare
M --out runs/uncached``, then ``sagegen eval runs/cached --against runs/uncached``: ``sage~sdpa`` is the cached
sagegen output against uncached stock (the whole error a user sees), ``sage~sage`` the cache's own share, and
``sdpa~sdpa`` what the cache costs stock alone.

Written into RUN's metrics.json under ``against[<OTHER's folder name>]`` (atomically, merged with the rest).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from sagegen.eval import stats
from sagegen.eval.weights import BadOption

PAIR_SEP = "~"  # "<variant of RUN>~<variant of OTHER>"
MATCHED_SETTINGS = ("steps", "frames", "height", "width")


def pair_name(ours: str, theirs: str) -> str:
    return f"{ours}{PAIR_SEP}{theirs}"


def check_comparable(run, other) -> None:
    """Raise BadOption (``--against: ...``) where OTHER cannot be compared with RUN pixel for pixel."""
    if run.path.resolve() == other.path.resolve():
        raise BadOption(f"--against: {other.path} is the run being evaluated; give the other run of the pair")
    name = (run.manifest.get("model") or {}).get("name")
    other_name = (other.manifest.get("model") or {}).get("name")
    if name != other_name:
        raise BadOption(f"--against: {other.path} ran model {other_name!r}, this run {name!r}")
    ours, theirs = run.manifest.get("settings") or {}, other.manifest.get("settings") or {}
    for key in MATCHED_SETTINGS:
        if ours.get(key) != theirs.get(key):
            raise BadOption(f"--against: {key} differs ({ours.get(key)!r} here, {theirs.get(key)!r} in "
                            f"{other.path}); the runs must match in everything but the setting compared")
    theirs_by_id = {s.id: s for s in other.samples}
    shared = [s for s in run.samples if s.id in theirs_by_id]
    if not shared:
        raise BadOption(f"--against: {other.path} has none of this run's finished samples "
                        f"({', '.join(s.id for s in run.samples[:3])}...)")
    for s in shared:
        t = theirs_by_id[s.id]
        if (s.prompt, s.seed) != (t.prompt, t.seed):
            raise BadOption(f"--against: sample {s.id} has prompt/seed {s.prompt!r}/{s.seed} here and "
                            f"{t.prompt!r}/{t.seed} in {other.path}")


def evaluate_against(run_dir: str | Path, other_dir: str | Path, metrics: list[str], lpips_loader: Callable[[], Any],
                     log: Callable[[str], None] = print) -> dict:
    """Compute ``metrics`` (a subset of psnr, ssim, lpips) for every pair of variants; returns the entry written
    under ``against[<OTHER's name>]`` in RUN/metrics.json."""
    from sagegen.eval import fidelity
    from sagegen.eval.metricsfile import now_iso, write_against
    from sagegen.runs.reader import load_frames, load_run

    run, other = load_run(run_dir, log=log), load_run(other_dir, log=log)
    check_comparable(run, other)
    theirs_by_id = {s.id: s for s in other.samples}
    shared = [s for s in run.samples if s.id in theirs_by_id]
    model = lpips_loader() if "lpips" in metrics else None
    pairs = [(v, w) for v in run.variants for w in other.variants]
    per: dict[str, dict[str, dict[str, dict]]] = {m: {pair_name(v, w): {} for v, w in pairs} for m in metrics}
    errors: dict[str, str] = {}
    for i, s in enumerate(shared):
        log(f"  [{i + 1}/{len(shared)}] {s.id}")
        try:
            ours = {v: load_frames(s.frame_paths(v)) for v in run.variants}
            theirs = {w: load_frames(theirs_by_id[s.id].frame_paths(w)) for w in other.variants}
        except (OSError, ValueError) as e:  # this sample's error, not the comparison's
            errors[s.id] = f"a frame cannot be read: {type(e).__name__}: {e}"
            continue
        shapes = {f.shape for f in (*ours.values(), *theirs.values())}
        if len(shapes) > 1:  # the whole sample is left out, not some of its pairs
            errors[s.id] = f"frames of shapes {sorted(shapes)} across the two runs"
            continue
        for v, w in pairs:
            a, b = ours[v], theirs[w]
            for m in metrics:
                if m == "psnr":
                    values = fidelity.psnr_frames(a, b)
                elif m == "ssim":
                    values = fidelity.ssim_frames(a, b)
                else:
                    values = fidelity.lpips_frames(model, a, b)
                per[m][pair_name(v, w)][s.id] = {"value": float(sum(values) / len(values)),
                                                 "per_frame": [float(x) for x in values]}
    prompt = {s.id: s.prompt for s in shared}
    entry: dict[str, Any] = {
        "run_dir": str(other.path.resolve()), "evaluated": now_iso(),
        "variants": {"here": run.variants, "there": other.variants},
        "samples": [s.id for s in shared if s.id not in errors], "metrics": {},
    }
    if errors:
        entry["sample_errors"] = errors
    for m in metrics:
        agg = {p: stats.mean_ci([e["value"] for e in by_id.values()], groups=[prompt[i] for i in by_id])
               for p, by_id in per[m].items()}
        entry["metrics"][m] = {"aggregate": agg, "per_sample": per[m]}
    write_against(run, other.path.name, entry)
    return entry
