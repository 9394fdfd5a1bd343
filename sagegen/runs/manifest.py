"""The manifest of a run directory: building it from a `sagegen.jobs.generate.Job`, and merging a new run into an
existing one (resume, adding a variant) or refusing it (`RunDirConflict`). Layout: docs/run-directory.md.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from sagegen.runs import integrity as runcheck
from sagegen.runs.directory import SCHEMA, now_iso

# What changes the pixels: a run directory holds one value of each (resuming checks them).
FINGERPRINT_KEYS = ("model", "settings", "samples")


class RunDirConflict(ValueError):
    """The run directory already holds a run with other settings."""


def _jsonable(obj: Any) -> Any:
    """`obj` as it will read back from manifest.json: JSON types only (tuples become lists, keys strings).

    Whatever is recorded or compared goes through here, so a value compares equal to its own reading back
    (a policy's ``blocks=(0,)`` is recorded as ``[0]`` and then compared as ``[0]``).
    """
    return json_normal(_plain(obj))


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool, list, tuple, dict)):
        return obj
    for attr in ("to_dict", "as_dict"):
        if hasattr(obj, attr):
            return getattr(obj, attr)()
    import dataclasses

    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return str(obj)


def json_normal(obj: Any) -> Any:
    """The value JSON gives back for `obj` (a round trip; objects JSON cannot hold become strings)."""
    return json.loads(json.dumps(obj, default=_plain))


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("torch", "triton", "diffusers", "transformers", "huggingface_hub", "accelerate", "sagegen"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def gpu_info(device) -> dict | None:
    import torch

    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        return None
    from sagegen.kernels.dispatch import describe_cuda

    props = torch.cuda.get_device_properties(device)
    ok, why = describe_cuda(device)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count(),
            "cuda": torch.version.cuda, "triton_kernels": ok, "why": why}


def build_manifest(job, dist, device) -> dict:
    """The manifest of `job` (a `sagegen.jobs.generate.Job`) run by process `dist` on `device`."""
    p = job.preset
    sage = "sage" in job.variants
    return json_normal({
        "schema": SCHEMA, "created": now_iso(), "command": list(job.command),
        "model": {"name": p.name, "family": p.family, "hub_id": p.hub_id, "kind": p.kind, "fps": p.fps,
                  "pipeline": p.pipeline, "model_path": job.model_path,
                  "random_weights": bool(job.settings.get("random_weights")), "tiny": p.tiny},
        "settings": dict(job.settings),
        "runtime": {"device": getattr(device, "type", str(device)), "offload": job.offload,
                    "compile": job.compile, "cuda_graphs": getattr(job, "cuda_graphs", False),
                    "warmup": job.warmup, "world_size": dist.world_size},
        "attention": {"sage": job.sage_config.to_dict() if sage else None,
                      "policy": _jsonable(job.policy) if sage else None,
                      "backend": job.backend if sage else None,
                      "linear": getattr(job, "linear", None) if sage else None},
        "variants": list(job.variants), "samples": [s.to_dict() for s in job.samples],
        "timings": {}, "setup": {}, "versions": versions(), "gpu": gpu_info(device),
    })


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            _diff(a.get(k), b.get(k), f"{path}.{k}", out)
    elif a != b:
        show = (lambda v: f"{len(v)} entries" if isinstance(v, list) and len(v) > 3 else json.dumps(v))
        out.append(f"{path.lstrip('.')}: {show(a)} -> {show(b)}")


def merge_manifest(current: dict | None, new: dict, where: Path) -> dict:
    """The manifest after adding `new`'s run to `current`'s (RunDirConflict when they cannot share a folder)."""
    new = json_normal(new)  # compare what will be read back, not the in-memory types
    if current is None:
        return new
    current = json_normal(current)
    diffs: list[str] = []
    for key in FINGERPRINT_KEYS:
        a, b = current.get(key), new.get(key)
        if key == "model":  # how the weights were found may differ between resumes; which model may not
            a = {k: v for k, v in (a or {}).items() if k in ("name", "model_path", "random_weights")}
            b = {k: v for k, v in b.items() if k in ("name", "model_path", "random_weights")}
        _diff(a, b, key, diffs)
    old_att, new_att = current.get("attention") or {}, new["attention"]
    if new_att.get("sage") is not None and old_att.get("sage") is not None:
        keys = ("sage", "policy", "backend", "linear")
        _diff({k: old_att.get(k) for k in keys}, {k: new_att.get(k) for k in keys}, "attention", diffs)
    if diffs:
        raise RunDirConflict(f"run directory {where} already holds a different run ({'; '.join(diffs[:4])}); "
                             "use another --out, or delete that folder to start over")
    merged = dict(new)
    merged["created"] = current.get("created", new["created"])
    merged["variants"] = list(dict.fromkeys([*current.get("variants", []), *new["variants"]]))
    merged["setup"] = current.get("setup", {})
    if new_att.get("sage") is None:
        merged["attention"] = old_att or new_att
    return merged


def expected_fingerprints(manifest: dict) -> dict[tuple[str, str], str]:
    """{(variant, sample id): the fingerprint that sample must carry} for every sample `manifest` plans."""
    return {(v, s["id"]): runcheck.fingerprint(runcheck.sample_identity(manifest, v, s))
            for v in manifest.get("variants", []) for s in manifest.get("samples", [])}


def check_samples(rd, manifest: dict, *, adopting: bool) -> dict[str, str]:
    """Refuse (RunDirConflict) a run directory whose samples cannot be this run's; return {"variant/id": why}
    for the damaged ones that generation will redo.

    With a manifest (`adopting` False) the manifest already matched this run: a sample that carries another
    fingerprint was put there from elsewhere. Without one (`adopting`, e.g. manifest.json deleted) every
    finished sample must prove with its fingerprint that this command made it, or the folder is refused."""
    expected = expected_fingerprints(manifest)
    root = rd.path / "samples"
    redo: dict[str, str] = {}
    if not root.is_dir():
        return redo
    for sample_dir in sorted(p for p in root.glob("*/*") if p.is_dir() or p.is_symlink()):
        variant, sid = sample_dir.parent.name, sample_dir.name
        where = f"samples/{variant}/{sid}"
        if not runcheck.inside(rd.path, sample_dir):
            raise RunDirConflict(f"{rd.path}: {where} leads outside the run directory "
                                 f"({sample_dir.resolve()}); sagegen reads and writes only inside it: remove the "
                                 "link, or use another --out")
        record, unreadable = runcheck.read_sample_record(sample_dir)
        if record is None:
            if (sample_dir / "sample.json").exists():
                redo[f"{variant}/{sid}"] = unreadable
            continue  # an interrupted attempt, or a damaged sample.json: redone
        want = expected.get((variant, sid))
        what = "is not one of this command's samples" if want is None else \
            runcheck.identity_problem(record, sid, want, strict=adopting)
        if what:
            if adopting:
                raise RunDirConflict(
                    f"{rd.path} holds samples but no manifest.json, and {where} {what}; nothing proves these "
                    "samples were made by this command: use another --out, or delete that folder to start over")
            raise RunDirConflict(f"{rd.path}: {where} {what}: use another --out, or delete that sample folder "
                                 "to generate it again")
        why = runcheck.integrity_problem(rd.path, sample_dir, record)
        if why:
            redo[f"{variant}/{sid}"] = why
    return redo
