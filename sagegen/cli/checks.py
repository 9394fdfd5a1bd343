"""Checks of a `run`/`compare` plan made before any model loads, each a `UsageProblem` (exit 2) naming the
option (the plan's size, the step count, the run directory `--out`, the precision policy against the preset's
blocks; the memory a run's sizes need is `sagegen.cli.memory`), and adjustments the user is told about (the
frame count the VAE makes, options the stock attention ignores)."""

from __future__ import annotations

import os
from pathlib import Path

from sagegen.cli.errors import UsageProblem

MAX_SAMPLES_ENV = "SAGEGEN_MAX_SAMPLES"
DEFAULT_MAX_SAMPLES = 10_000  # prompts x seeds; one sample of a video model takes minutes on a GPU


def max_samples() -> int:
    raw = os.environ.get(MAX_SAMPLES_ENV, "").strip()
    try:
        return max(1, int(raw)) if raw else DEFAULT_MAX_SAMPLES
    except ValueError:
        raise UsageProblem(f"${MAX_SAMPLES_ENV}={raw!r} is not an integer") from None


def check_plan_size(n_prompts: int, n_seeds: int) -> None:
    """Refuse a plan of more than `max_samples()` samples (prompts x seeds) before it is built."""
    limit = max_samples()
    total = n_prompts * n_seeds
    if total > limit:
        option = "--seed" if n_seeds > 1 else "--prompts"
        raise UsageProblem(f"{n_prompts} prompt(s) x {n_seeds} seed(s) = {total:,} samples, more than the limit "
                           f"of {limit:,} per run directory; use fewer seeds or prompts (--max-prompts N), or "
                           f"raise the limit with {MAX_SAMPLES_ENV}=N", option)


# Diffusers' DDIM-style schedulers (CogVideoX's) have 1000 training timesteps and refuse more; the flow-matching
# ones take any count, but allocate a table per step (10^11 steps was a MemoryError) and gain nothing from more.
MAX_STEPS = 1000


def check_steps(steps: int | None) -> None:
    """--steps at most `MAX_STEPS` (its lower bound, 1 or the preset's, is checked with the sizes)."""
    if steps is not None and steps > MAX_STEPS:
        raise UsageProblem(f"{steps} denoising steps is more than the {MAX_STEPS} allowed (the schedulers are "
                           f"trained on 1000 timesteps; presets use 4-64); give 1 to {MAX_STEPS}", "--steps")


def check_out_dir(path: Path, option: str = "--out") -> None:
    """`path` must be a folder that exists and is writable, or can be created: not a file, not under a file,
    not under a read-only folder."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageProblem(f"{path} is a file, not a folder; give a folder for the run directory", option)
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise UsageProblem(f"{path} cannot be created: {existing} is a file, not a folder", option)
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        raise UsageProblem(f"{path} {what}; choose another folder (or fix its permissions)", option)
    # os.access says yes to root everywhere (and on /proc): create it to know. Not under torchrun: the probe's
    # removal could take away the folder another rank has just made.
    if existing != path:
        if os.environ.get("WORLD_SIZE", "1") == "1":
            top = path
            while not top.parent.exists():
                top = top.parent
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UsageProblem(f"{path} cannot be created ({e.strerror or e}); choose another folder",
                                   option) from None
            _remove_created(path, top)
    elif any(True for _ in path.iterdir()) and not any((path / name).exists() for name in _RUN_DIR_MARKS):
        held = sorted(p.name for p in path.iterdir())
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise UsageProblem(f"{path} holds other files ({shown}) and is not a sagegen run directory; give a new or "
                           "empty folder (or an earlier run's, to resume it)", option)


# what an existing run directory holds from its first moment (`generate`, `lock`)
_RUN_DIR_MARKS = ("manifest.json", ".manifest.lock", ".sagegen-run.lock", "samples")


def _remove_created(path: Path, top: Path) -> None:
    """Remove the empty folders `check_out_dir` made, from `path` up to `top`."""
    here = path
    while True:
        try:
            here.rmdir()
        except OSError:  # another rank's, or no longer empty: leave it
            return
        if here == top:
            return
        here = here.parent


def check_video_encoder(preset) -> None:
    """Video presets save MP4s through the ffmpeg that imageio-ffmpeg ships: find it before any weights load,
    not after the first sample was generated (whose frames would then be thrown away)."""
    if not preset.is_video:
        return
    from sagegen.runs.encode import find_ffmpeg

    _, problem = find_ffmpeg()
    if problem is not None:
        raise UsageProblem(f"{preset.name} writes MP4 videos through imageio-ffmpeg's ffmpeg, which is not usable "
                           f"here ({problem}); install it with `pip install imageio-ffmpeg` (a sagegen "
                           "dependency), or, where it is installed but has no binary, set IMAGEIO_FFMPEG_EXE to an "
                           "ffmpeg executable")


def check_policy_blocks(preset, blocks, *, model_path) -> None:
    """Integer --fp-blocks entries against the preset's block count, where that is known without loading.

    Module names are checked when the model is patched (the names need the built transformer); a local
    --model-path may hold another config, so its count is not assumed."""
    ints = [b for b in blocks if isinstance(b, int)]
    if not ints or model_path is not None:
        return
    from sagegen.models.block_counts import block_count

    n = block_count(preset)
    if n is None:
        return
    bad = [b for b in ints if not -n <= b < n]
    if bad:
        raise UsageProblem(f"block index {', '.join(map(str, bad))} is out of range: {preset.name} has {n} "
                           f"blocks (indices 0..{n - 1}, or -{n}..-1 from the end)", "--fp-blocks")


def fitted_frames(preset, frames: int | None) -> tuple[int | None, str | None]:
    """The frame count to generate and record, and a note when --frames was adjusted to it.

    The video VAEs make ``k * frame_step + 1`` frames; the pipelines round other counts down silently. Passing
    the rounded count makes the manifest record what comes out. The preset's own default is left as its
    authors give it (Mochi's 84, which decodes to 79, is documented in its preset notes)."""
    if not preset.is_video:
        return None, None
    if frames is None or frames < 1:
        return (frames or preset.frames), None
    step = preset.frame_step
    if step <= 1 or (frames - 1) % step == 0 or frames == preset.frames:
        return frames, None
    fitted = (frames - 1) // step * step + 1
    return fitted, (f"--frames {frames}: {preset.name}'s VAE makes {step}k+1 frames, so {fitted} frames are "
                    f"generated and recorded (use --frames {fitted} or {fitted + step} to choose exactly)")


# Options that only the sage variant reads (and their defaults).
SAGE_ONLY = {"kernel": ("--kernel", None), "fp_blocks": ("--fp-blocks", None),
             "fp_first_steps": ("--fp-first-steps", 0), "fp_last_steps": ("--fp-last-steps", 0),
             "backend": ("--backend", "auto")}


def ignored_with_stock(variants, **given) -> list[str]:
    """A warning naming the sagegen-only options given to a run of the stock attention alone."""
    if "sage" in variants:
        return []
    named = [flag for key, (flag, default) in SAGE_ONLY.items() if given.get(key) not in (default, [], "")]
    if not named:
        return []
    return [f"{', '.join(named)} {'has' if len(named) == 1 else 'have'} no effect with --attention sdpa (the "
            "stock attention runs, not sagegen's); ignored"]
