"""Which diffusers versions sagegen works with: one check of the installed diffusers, on CPU, offline.

Run by `make test-diffusers` (bench/diffusers_versions.sh), once per diffusers version, each installed beside
the project's own environment. For the installed version it checks:
- the ``"sagegen"`` attention backend: registered, or the clear `DiffusersBackendUnavailable` error;
- the five tiny pipelines (fused routes): two steps stock, `sagegen.patch`, two steps patched (the latents
  within the quantization's error of stock), `unpatch` (bit-identical to stock again);
- the tiny transformers of the newer models (tests/support/dispatch_models.py): the same at one forward call. A class
  this diffusers lacks is reported as absent; a model whose forward rejects the test's inputs (written for
  diffusers 0.42) is reported as not checked.
It prints one JSON line per check and a final summary line, and exits 1 if any check failed (a patch that
raised, an output off stock, an unpatch that is not exact): "absent" and "not checked" are not failures.

    TRITON_INTERPRET=1 python tests/support/diffusers_compat.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PIPELINE_TOL = 0.06  # rel. L1 of a tiny pipeline's latents vs stock (tests/patch/test_patch_pipelines.py)
MODEL_TOL = 0.03  # rel. L1 of a tiny transformer's output vs stock (tests/patch/test_patch_routes.py)


def _backend() -> dict:
    import sagegen

    try:
        member = sagegen.register_diffusers_backend()
        return {"check": "backend", "status": "ok", "member": str(member)}
    except sagegen.DiffusersBackendUnavailable as e:
        return {"check": "backend", "status": "unavailable", "why": str(e)}
    except Exception as e:  # noqa: BLE001 - anything else is a failure to report, not to hide
        return {"check": "backend", "status": "failed", "why": f"{type(e).__name__}: {e}"}


def _patched_vs_stock(name: str, model: torch.nn.Module, forward, tol: float) -> dict:
    """forward() -> tensor, run stock, patched and unpatched; `model` is what gets patched."""
    import sagegen

    row = {"check": name}
    try:
        with torch.no_grad():
            ref = forward()
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "not checked", "why": f"stock forward: {type(e).__name__}: {str(e)[:200]}"}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sagegen.patch(model)
        with torch.no_grad():
            out = forward()
        info = sagegen.patch_info(model)  # after the call: its stats count the routed calls
        sagegen.unpatch(model)
        with torch.no_grad():
            back = forward()
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "failed", "why": f"{type(e).__name__}: {str(e)[:300]}"}
    from tests.support.helpers import rel_l1

    err = rel_l1(out, ref)
    ok = 0 < err <= tol and torch.equal(back, ref) and info["stats"].get("routed", 0) > 0
    return {**row, "status": "ok" if ok else "failed", "routes": info["routes"], "rel_l1": round(err, 5),
            "unpatch_exact": bool(torch.equal(back, ref)),
            "warnings": sorted({str(w.message)[:160] for w in caught if "sagegen" in str(w.message)})}


def _pipelines() -> list[dict]:
    from sagegen.models.tiny import TINY_CALL_DEFAULTS, TINY_FAMILIES, build_tiny_pipeline

    rows = []
    for family in TINY_FAMILIES:
        try:
            pipe = build_tiny_pipeline(family, seed=0)
            pipe.set_progress_bar_config(disable=True)
        except Exception as e:  # noqa: BLE001
            rows.append({"check": f"pipeline:{family}", "status": "failed",
                         "why": f"build: {type(e).__name__}: {str(e)[:200]}"})
            continue
        call = {**TINY_CALL_DEFAULTS[family], "num_inference_steps": 2}

        def forward(pipe=pipe, call=call):
            out = pipe(prompt="a cat walks on the grass", generator=torch.Generator().manual_seed(0),
                       output_type="latent", **call)
            return (out.frames if hasattr(out, "frames") else out.images).float()

        rows.append(_patched_vs_stock(f"pipeline:{family}", pipe, forward, PIPELINE_TOL))
    return rows


def _models() -> list[dict]:
    from tests.support.dispatch_models import DISPATCH_MODELS

    rows = []
    for name, build in DISPATCH_MODELS.items():
        try:
            model, inputs = build()
        except ImportError as e:
            rows.append({"check": f"model:{name}", "status": "absent", "why": str(e)[:200]})
            continue
        rows.append(_patched_vs_stock(f"model:{name}", model, lambda m=model, i=inputs: m(**i)[0], MODEL_TOL))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    import diffusers
    import huggingface_hub
    import transformers

    env = {"diffusers": diffusers.__version__, "transformers": transformers.__version__,
           "huggingface-hub": huggingface_hub.__version__, "torch": torch.__version__}
    rows = [_backend(), *_pipelines(), *_models()]
    for row in rows:
        print(json.dumps(row), flush=True)
    failed = [r["check"] for r in rows if r["status"] == "failed"]
    summary = {"summary": env, "ok": sum(r["status"] == "ok" for r in rows), "failed": failed,
               "absent": [r["check"] for r in rows if r["status"] == "absent"],
               "not_checked": [r["check"] for r in rows if r["status"] == "not checked"],
               "backend": rows[0]["status"]}
    print(json.dumps(summary), flush=True)
    if args.out:
        tmp = args.out + ".tmp"
        Path(tmp).write_text(json.dumps({"environment": env, "rows": rows, "summary": summary}, indent=1))
        os.replace(tmp, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
