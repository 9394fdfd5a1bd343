"""Getting a pipeline: built-in tiny models, a local folder, the Hugging Face cache, or the hub (offline-first).

Order: ``--model-path`` (a local diffusers folder) > the local Hugging Face cache > the hub. The cache is
checked on disk before anything touches the network; when nothing is cached and the hub cannot be reached
(or ``HF_HUB_OFFLINE=1``), `WeightsUnavailable` is raised within seconds, saying how to get the weights.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sagegen.models.presets import Preset

DTYPES = ("bfloat16", "float16", "float32")
OFFLOAD = ("none", "model", "sequential")
PROBE_TIMEOUT_S = 3.0


class WeightsUnavailable(RuntimeError):
    """The weights are neither local nor reachable; the message says how to get them."""


class BadModelPath(ValueError):
    """--model-path is not a diffusers pipeline folder."""


# ------------------------------------------------------------------------------------------ HF cache
def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def hf_offline() -> bool:
    return _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("TRANSFORMERS_OFFLINE"))


def hf_cache_dir() -> Path:
    """The hub cache folder, read from the environment now (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def _missing_components(folder: Path, spec: dict | None = None) -> list[str]:
    """Components named in model_index.json with no folder (a partial download), or ["model_index.json"]."""
    if spec is None:
        try:
            spec = json.loads((folder / "model_index.json").read_text())
        except (OSError, ValueError):
            return ["model_index.json"]
        if not isinstance(spec, dict):
            return ["model_index.json"]
    return [k for k, v in spec.items()
            if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[1] is not None
            and not (folder / k).is_dir()]


def check_model_path(preset: Preset, model_path: str | os.PathLike) -> Path:
    """--model-path must be a complete diffusers folder of the preset's pipeline class; checked from the files
    alone (no torch, no diffusers), before anything loads. Returns the folder; BadModelPath says what is wrong."""
    folder = Path(model_path).expanduser()
    how = (f"point it at a diffusers pipeline folder (one with model_index.json), e.g. one made by "
           f"`hf download {preset.hub_id or 'REPO'} --local-dir DIR`")
    if not folder.exists():
        raise BadModelPath(f"--model-path {folder} does not exist; {how}")
    if not folder.is_dir():
        inside = f"; give its folder, {folder.parent}" if folder.name == "model_index.json" else f"; {how}"
        raise BadModelPath(f"--model-path {folder} is a file, not a folder{inside}")
    index = folder / "model_index.json"
    if not index.is_file():
        raise BadModelPath(f"--model-path {folder} has no model_index.json (not a diffusers pipeline folder); "
                           f"{how}")
    try:
        spec = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise BadModelPath(f"--model-path {folder}: model_index.json cannot be read ({e})") from None
    except ValueError as e:
        raise BadModelPath(f"--model-path {folder}: model_index.json is not valid JSON ({e}); the download may "
                           f"be damaged: {how}") from None
    if not isinstance(spec, dict):
        raise BadModelPath(f"--model-path {folder}: model_index.json is not a JSON object; {how}")
    found = spec.get("_class_name")
    if found != preset.pipeline:
        from sagegen.models.presets import PRESETS

        fits = [p.name for p in PRESETS.values() if p.pipeline == found and not p.tiny]
        other = (f"use a preset of that pipeline ({', '.join(fits)})" if fits
                 else "sagegen has no preset for that pipeline")
        raise BadModelPath(f"--model-path {folder} holds a {found or 'pipeline without _class_name'} "
                           f"(model_index.json's _class_name), but {preset.name} loads a {preset.pipeline}: "
                           f"{other}, or give a {preset.pipeline} folder")
    missing = _missing_components(folder, spec)
    if missing:
        raise BadModelPath(f"--model-path {folder} is not a complete diffusers pipeline folder (missing: "
                           f"{', '.join(missing[:4])}); {how}")
    return folder


def cached_snapshot(preset: Preset) -> tuple[Path | None, str]:
    """(snapshot folder, state) for a hub preset: state is "cached", "partial" or "missing"."""
    from huggingface_hub import try_to_load_from_cache

    state = "missing"
    for repo in preset.hub_ids():
        hit = try_to_load_from_cache(repo, "model_index.json", cache_dir=str(hf_cache_dir()))
        if isinstance(hit, str):
            snap = Path(hit).parent
            if not _missing_components(snap):
                return snap, "cached"
            state = "partial"
    return None, state


def weights_status(preset: Preset) -> str:
    """For `sagegen models`: "built-in", "cached", "partial" or "not downloaded"."""
    if preset.tiny:
        return "built-in"
    _, state = cached_snapshot(preset)
    return {"cached": "cached", "partial": "partial"}.get(state, "not downloaded")


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Whether a TCP connection to the hub endpoint opens within `timeout` (DNS included, in a thread)."""
    from huggingface_hub import constants

    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    result: list[tuple[bool, str]] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append((True, f"{host}:{port} reachable"))
        except OSError as e:
            result.append((False, f"cannot reach {host}:{port} ({e.__class__.__name__}: {e})"))

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return result[0] if result else (False, f"cannot reach {host}:{port} (no answer in {timeout:.0f} s)")


def how_to_get(preset: Preset) -> str:
    repo = preset.hub_id
    licence = (f"accept the licence at https://huggingface.co/{repo} and log in (`hf auth login`), then "
               if preset.gated else "")
    return (f"{licence}download it with `hf download {repo}` (older huggingface_hub: `huggingface-cli download "
            f"{repo}`), or pass a local diffusers folder with --model-path DIR; `--random-weights` measures "
            f"speed at {preset.name}'s real shapes without any download")


def locate(preset: Preset, model_path: str | os.PathLike | None) -> tuple[str | None, bool, str]:
    """Where to load from: (path or repo id, local_files_only, description). Fails fast when unavailable."""
    if model_path is not None:
        folder = check_model_path(preset, model_path)
        return str(folder), True, f"local folder {folder}"
    if preset.tiny:
        return None, True, "built-in tiny model (random weights)"
    snap, state = cached_snapshot(preset)
    if snap is not None:
        return str(snap), True, f"Hugging Face cache ({hf_cache_dir()})"
    where = f"not in the Hugging Face cache ({hf_cache_dir()})" + (" (partial download)" if state == "partial"
                                                                   else "")
    if hf_offline():
        raise WeightsUnavailable(f"{preset.name} ({preset.hub_id}) is {where} and HF_HUB_OFFLINE=1; "
                                 + how_to_get(preset))
    ok, why = hub_reachable()
    if not ok:
        raise WeightsUnavailable(f"{preset.name} ({preset.hub_id}) is {where} and the hub is unreachable "
                                 f"({why}); " + how_to_get(preset))
    return preset.hub_id, False, f"Hugging Face hub ({preset.hub_id}, downloading into {hf_cache_dir()})"


# -------------------------------------------------------------------------------------------- loading
@dataclass
class Loaded:
    pipe: Any
    source: str
    load_s: float
    # Extra pipeline-call arguments per sample (e.g. random prompt embeddings for --random-weights).
    call_overrides: Callable[[str, int], dict] | None = None
    info: dict = field(default_factory=dict)


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; use one of {DTYPES}")
    return getattr(torch, name)


def _load_hub(preset: Preset, where: str, local_only: bool, dtype):
    import diffusers

    cls = getattr(diffusers, preset.pipeline)
    kwargs: dict[str, Any] = {"torch_dtype": dtype, "local_files_only": local_only}
    local = os.path.isdir(where)
    if preset.variant and (not local or any(Path(where).glob(f"*/*.{preset.variant}*"))):
        kwargs["variant"] = preset.variant  # e.g. Mochi's bf16 files, when they are there
    if not local:
        kwargs["cache_dir"] = str(hf_cache_dir())
    try:
        return cls.from_pretrained(where, **kwargs)
    except Exception as e:  # map missing files and access errors to something actionable
        text = f"{type(e).__name__}: {e}"
        if "Gated" in text or " 401" in text or " 403" in text:
            raise WeightsUnavailable(f"{preset.hub_id} needs access: {how_to_get(preset)}") from e
        if local and isinstance(e, (OSError, ValueError)):
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise WeightsUnavailable(f"could not load {preset.name} from {where} ({first}); the copy may be "
                                     f"incomplete: " + how_to_get(preset)) from e
        raise


def _load_tiny(preset: Preset, dtype, seed: int):
    try:
        from sagegen.models import tiny, tiny_video
    except ImportError as e:
        raise WeightsUnavailable(f"the built-in tiny models are not available in this checkout "
                                 f"(sagegen.models.tiny: {e}); update sagegen") from e
    kind = preset.name.removeprefix("tiny-")  # tiny-wan2.1 -> tiny_video's "wan2.1"; tiny-flux -> tiny's "flux"
    if kind in tiny_video.TINY_VIDEO_KINDS:
        return tiny_video.build_tiny_video_pipeline(kind, seed=seed, dtype=dtype)
    return tiny.build_tiny_pipeline(preset.family, seed=seed, dtype=dtype)


def place(pipe, device, *, offload: str = "none", vae_tiling: bool = False, vae_slicing: bool = False) -> list[str]:
    """Move the pipeline to `device` (or set up CPU offload) and turn on the VAE memory savers.

    Returns notes about savers the pipeline does not support."""
    notes = []
    if offload not in OFFLOAD:
        raise ValueError(f"offload {offload!r} is not supported; use one of {OFFLOAD}")
    if offload == "model":
        pipe.enable_model_cpu_offload(device=device)
    elif offload == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
    else:
        pipe.to(device)
    vae = getattr(pipe, "vae", None)
    for wanted, method in ((vae_tiling, "enable_tiling"), (vae_slicing, "enable_slicing")):
        if wanted:
            if vae is not None and hasattr(vae, method):
                getattr(vae, method)()
            else:
                notes.append(f"{type(vae).__name__} has no {method}(); ignored")
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    return notes


def ignore_known_warnings() -> None:
    """Silence warnings of diffusers' own code that say nothing to a sagegen user (narrow filters).

    MochiTransformer3DModel computes its rotary frequencies under ``torch.autocast(device, torch.float32)``
    with inputs it has already cast to float32; on a CPU torch then warns that float32 is no autocast dtype
    and disables autocast, which changes nothing for that computation."""
    import warnings

    warnings.filterwarnings("ignore", message=r"In (CPU|CUDA) autocast, but the target dtype is not supported",
                            category=UserWarning, module=r"diffusers\.models\.transformers\.transformer_mochi")


@contextlib.contextmanager
def _quiet_libraries():
    """diffusers/transformers chatter (dtype-cast notices, progress bars) off while loading; errors stay."""
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    saved = (dlog.get_verbosity(), tlog.get_verbosity())
    dlog.set_verbosity_error()
    tlog.set_verbosity_error()
    try:
        yield
    finally:
        dlog.set_verbosity(saved[0])
        tlog.set_verbosity(saved[1])


def load(preset: Preset, *, dtype: str, device, model_path=None, random_weights: bool = False, seed: int = 0,
         offload: str = "none", vae_tiling: bool = False, vae_slicing: bool = False) -> Loaded:
    """Build or load the pipeline for `preset` and place it on `device`."""
    t0 = time.perf_counter()
    tdtype = torch_dtype(dtype)
    overrides = None
    ignore_known_warnings()
    with _quiet_libraries():
        if random_weights:
            from sagegen.models.random_weights import build_random_pipeline

            pipe, overrides = build_random_pipeline(preset, dtype=tdtype, seed=seed, device=device)
            source = f"random weights at {preset.name}'s full-size architecture"
        else:
            where, local_only, source = locate(preset, model_path)
            pipe = (_load_tiny(preset, tdtype, seed) if where is None
                    else _load_hub(preset, where, local_only, tdtype))
        notes = place(pipe, device, offload=offload, vae_tiling=vae_tiling, vae_slicing=vae_slicing)
    return Loaded(pipe=pipe, source=source, load_s=time.perf_counter() - t0, call_overrides=overrides,
                  info={"notes": notes})
