"""Offline resolution of metric weights. Nothing here downloads: a metric whose weights cannot be found
locally raises :class:`WeightsMissing` with a one-line reason saying how to provide them."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CLIP = "ViT-B-32/openai"  # OpenAI CLIP ViT-B/32: EvalCrafter's model, and the standard mode's default
LOCAL_DIR = "local-dir:"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
INCEPTION_ENV = "SAGEGEN_INCEPTION_WEIGHTS"
LPIPS_ENV = "SAGEGEN_LPIPS_WEIGHTS"
CLIP_ENV = "SAGEGEN_CLIP_MODEL"


class WeightsMissing(Exception):
    """A metric's weights are not available offline; ``str(e)`` is the one-line reason."""


class BadOption(ValueError):
    """A malformed option value; the message names the option and what it accepts."""


@dataclass
class ClipSource:
    arch: str  # open_clip model name, or "local-dir:/folder"
    checkpoint: str | None  # weights file (None for local-dir: open_clip finds it in the folder)
    label: str  # what the output and metrics.json call it
    force_quick_gelu: bool = False
    preprocess_cfg: dict[str, Any] = field(default_factory=dict)
    is_evalcrafter_model: bool = False  # OpenAI ViT-B/32, the model EvalCrafter uses


def _hf_cache_dir() -> str:
    env = os.environ.get("HF_HUB_CACHE")
    if env:
        return env
    home = os.environ.get("HF_HOME")
    if home:
        return os.path.join(home, "hub")
    return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def _find_in_hf_cache(repo_id: str, filenames: list[str]) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    for fn in filenames:
        try:
            hit = try_to_load_from_cache(repo_id, fn, cache_dir=_hf_cache_dir())
        except Exception:  # malformed repo id etc.: treat as not cached
            hit = None
        if isinstance(hit, str) and os.path.isfile(hit):
            return hit
    return None


def weights_file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be a weights file, judged from its first bytes (None: it may be one). torch.load of a
    text file fails deep in the unpickler (``KeyError: 105``), after the metric has started."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = os.path.getsize(path)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch.save / TorchScript zip; legacy pickle
        return None
    if len(head) == 9 and head[8:9] == b"{" and 8 + int.from_bytes(head[:8], "little") <= size:  # safetensors
        return None
    what = "is empty" if size == 0 else "is not a PyTorch or safetensors weights file"
    return what + (" (it looks like text)" if head and all(32 <= c < 127 or c in b"\t\r\n" for c in head) else "")


def _check_weights_file(path: str | os.PathLike, option: str) -> None:
    problem = weights_file_problem(path)
    if problem:
        raise BadOption(f"{option}: {path} {problem}")


def check_weight_options(clip_model: str | None, inception_weights: str | None, lpips_weights: str | None) -> None:
    """The weight files given on the command line are weights (BadOption naming the option otherwise), checked
    before any metric runs. Names that are not files (cache tags, missing paths) are left to the resolvers."""
    if clip_model and not clip_model.startswith(LOCAL_DIR):
        spec = os.path.expanduser(clip_model.strip())
        path = spec if os.path.isfile(spec) else spec.split(":", 1)[-1]
        if os.path.isfile(path):
            _check_weights_file(path, "--clip-model")
    for value, option in ((inception_weights, "--inception-weights"), (lpips_weights, "--lpips-weights")):
        if value and os.path.isfile(os.path.expanduser(value)):
            _check_weights_file(os.path.expanduser(value), option)


def _looks_like_path(s: str) -> bool:
    return s.startswith(("/", "./", "../", "~")) or s.endswith(WEIGHT_SUFFIXES) or os.path.exists(s)


def _weights_in_dir(d: Path) -> list[Path]:
    return [p for p in sorted(d.iterdir()) if p.suffix in WEIGHT_SUFFIXES and p.is_file()]


def resolve_clip(spec: str | None) -> ClipSource:
    """``--clip-model``: ``NAME/TAG`` or ``NAME:TAG`` (open_clip model and pretrained tag, found in the local
    Hugging Face or open_clip caches), ``[NAME:]PATH`` (a checkpoint file; NAME defaults to
    ``ViT-B-32-quickgelu``, OpenAI's ViT-B/32 architecture), or ``local-dir:FOLDER`` (open_clip_config.json
    plus weights). Default: ``$SAGEGEN_CLIP_MODEL`` or ``ViT-B-32/openai``."""
    import open_clip

    spec = (spec or os.environ.get(CLIP_ENV) or DEFAULT_CLIP).strip()
    how = "pass --clip-model NAME/TAG (cached), --clip-model PATH, or --clip-model local-dir:FOLDER"
    if spec.startswith(LOCAL_DIR):
        folder = Path(os.path.expanduser(spec[len(LOCAL_DIR) :]))
        if not folder.is_dir():
            raise WeightsMissing(f"CLIP folder {folder} not found; {how}")
        if not (folder / "open_clip_config.json").is_file():
            raise WeightsMissing(f"CLIP folder {folder} has no open_clip_config.json; {how}")
        if not _weights_in_dir(folder):
            raise WeightsMissing(f"CLIP folder {folder} has no weights file (*.safetensors/*.bin/*.pth); {how}")
        return ClipSource(arch=f"{LOCAL_DIR}{folder}", checkpoint=None, label=f"{LOCAL_DIR}{folder}")

    arch, rest = None, spec
    bare_path = os.path.isfile(os.path.expanduser(spec)) or spec.startswith(("/", "./", "../", "~"))
    if not bare_path:
        for sep in (":", "/"):
            if sep in spec:
                arch, rest = spec.split(sep, 1)
                break
        else:
            arch, rest = spec, ""
        if arch not in open_clip.list_models():
            if spec.endswith(WEIGHT_SUFFIXES):
                raise WeightsMissing(f"CLIP checkpoint {spec} not found; {how}")
            close = [m for m in open_clip.list_models() if arch.lower().split("-")[0] in m.lower()][:8]
            raise BadOption(
                f"--clip-model: unknown open_clip model {arch!r}; expected NAME/TAG, PATH or local-dir:FOLDER "
                f"(models like: {', '.join(close or open_clip.list_models()[:8])})"
            )

    if arch is None or _looks_like_path(rest):  # a checkpoint file
        path = Path(os.path.expanduser(rest))
        arch = arch or "ViT-B-32-quickgelu"
        if not path.is_file():
            raise WeightsMissing(f"CLIP checkpoint {path} not found; {how}")
        _check_weights_file(path, "--clip-model")
        return ClipSource(arch=arch, checkpoint=str(path), label=f"{arch}:{path}")

    tag = rest
    if not tag:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise BadOption(f"--clip-model: {arch!r} needs a pretrained tag, e.g. {arch}/{tags[0] if tags else 'TAG'}")
    cfg = open_clip.get_pretrained_cfg(arch, tag)
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise BadOption(f"--clip-model: {arch!r} has no pretrained tag {tag!r}; tags: {', '.join(tags) or 'none'}")
    found = None
    hub = cfg.get("hf_hub") or ""
    if hub:
        repo_id, fn = os.path.split(hub.rstrip("/")) if not hub.endswith("/") else (hub.rstrip("/"), "")
        names = [fn] if fn else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        found = _find_in_hf_cache(repo_id, names)
    url = cfg.get("url") or ""
    if not found and url:
        cand = Path(os.path.expanduser("~/.cache/clip")) / os.path.basename(url)
        found = str(cand) if cand.is_file() else None
    if not found:
        where = f"HF cache {_hf_cache_dir()} ({hub.rstrip('/')})" if hub else "the open_clip cache"
        raise WeightsMissing(
            f"CLIP weights {arch}/{tag} not found offline in {where}; {how}"
        )
    pcfg = {k: cfg[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in cfg}
    return ClipSource(
        arch=arch,
        checkpoint=found,
        label=f"{arch}/{tag}",
        force_quick_gelu=bool(cfg.get("quick_gelu", False)),
        preprocess_cfg=pcfg,
        is_evalcrafter_model=(arch in ("ViT-B-32", "ViT-B-32-quickgelu") and tag == "openai"),
    )


def resolve_inception(path: str | None) -> Path:
    """``--inception-weights PATH`` (or ``$SAGEGEN_INCEPTION_WEIGHTS``): a TorchScript Inception feature
    extractor (e.g. ``inception-2015-12-05.pt``, the TF FID weights as TorchScript) or a torchvision
    Inception-v3 state dict. No pip package ships FID's Inception weights, so without one FID/KID are skipped."""
    p = path or os.environ.get(INCEPTION_ENV)
    how = ("pass --inception-weights PATH (TorchScript inception-2015-12-05.pt, pytorch-fid's pt_inception-*.pth "
           f"or a torchvision Inception-v3 .pth) or set ${INCEPTION_ENV}")
    if not p:
        raise WeightsMissing(f"no Inception weights (none ship in a package; nothing is downloaded); {how}")
    pp = Path(os.path.expanduser(p))
    if not pp.is_file():
        raise WeightsMissing(f"Inception weights {pp} not found; {how}")
    _check_weights_file(pp, "--inception-weights" if path else f"${INCEPTION_ENV}")
    return pp


def _lpips_lin_from_package() -> Path | None:
    spec = importlib.util.find_spec("lpips")
    if spec is None or not spec.submodule_search_locations:
        return None
    cand = Path(list(spec.submodule_search_locations)[0]) / "weights" / "v0.1" / "alex.pth"
    return cand if cand.is_file() else None


def _alexnet_from_torch_cache() -> Path | None:
    try:
        import torch

        d = Path(torch.hub.get_dir()) / "checkpoints"
    except Exception:
        return None
    hits = sorted(d.glob("alexnet-owt-*.pth")) if d.is_dir() else []
    return hits[0] if hits else None


def resolve_lpips(path: str | None) -> dict:
    """LPIPS (AlexNet) weights as one state dict: ``--lpips-weights PATH`` (a combined .pth with ``features.*``
    and ``lin{i}.model.1.weight`` keys, or a folder holding torchvision's ``alexnet-owt-*.pth`` and the lpips
    package's ``alex.pth``), ``$SAGEGEN_LPIPS_WEIGHTS``, or the torch hub cache plus an installed ``lpips``
    package. Returns the merged state dict."""
    import torch

    p = path or os.environ.get(LPIPS_ENV)
    how = (
        "pass --lpips-weights PATH (combined .pth, or a folder with alexnet-owt-*.pth and lpips' alex.pth) "
        f"or set ${LPIPS_ENV}"
    )
    backbone: Path | None = None
    lin: Path | None = None
    if p:
        pp = Path(os.path.expanduser(p))
        if pp.is_file():
            _check_weights_file(pp, "--lpips-weights" if path else f"${LPIPS_ENV}")
            return dict(torch.load(str(pp), map_location="cpu", weights_only=True))
        if not pp.is_dir():
            raise WeightsMissing(f"LPIPS weights {pp} not found; {how}")
        hits = sorted(pp.glob("alexnet*.pth"))
        backbone = hits[0] if hits else None
        lin = pp / "alex.pth" if (pp / "alex.pth").is_file() else None
    else:
        backbone, lin = _alexnet_from_torch_cache(), _lpips_lin_from_package()
    if backbone is None:
        raise WeightsMissing(f"LPIPS AlexNet backbone weights (alexnet-owt-*.pth) not found offline; {how}")
    if lin is None:
        raise WeightsMissing(f"LPIPS linear-head weights (lpips' v0.1 alex.pth) not found offline; {how}")
    state = {k: v for k, v in torch.load(str(backbone), map_location="cpu", weights_only=True).items()}
    for k, v in torch.load(str(lin), map_location="cpu", weights_only=True).items():
        state[k if k.startswith("lin") else k] = v
    return state
