"""Accuracy of FP8 linears at full size (random weights): per layer against bf16, and of one step against stock.

For each model: build the full-size transformer (random bf16 weights, on the GPU), run one step stock, then
patched with sagegen attention + FP8 linears on every block (``keep_blocks=()``, ``min_rows=1``, so every
linear in the blocks is measured) with a forward hook on each FP8 layer comparing its output to the bf16
product of the same input (computed in fp32). Then the step with the default policy (first/last block and
embedders in bf16) and with attention only. Writes JSON (device, versions, date) to --out.

    python bench/fp8_layer_accuracy.py flux.1-dev sd3.5-large cogvideox-5b hunyuanvideo \\
        --out bench/results/fp8-accuracy-h100-$(date +%F).json     # ~2-4 min on an H100 (HunyuanVideo longest)
    python bench/fp8_layer_accuracy.py flux.1-dev --height 512 --width 512 --out /tmp/acc.json   # quicker
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch.nn.functional as F  # noqa: E402

import sagegen  # noqa: E402
from sagegen.linear import FP8Linear, LinearPolicy  # noqa: E402
from sagegen.models import arch as archs  # noqa: E402
from sagegen.patch import patch_info  # noqa: E402
from sagegen.runs.files import atomic_write_json  # noqa: E402
from sagegen.jobs.stepbench.measure import compare, versions  # noqa: E402


def _layer_errors(model, inputs) -> dict:
    stats: dict[str, list[tuple[float, float]]] = {}
    names = {id(m): n for n, m in model.named_modules() if isinstance(m, FP8Linear)}

    def hook(module, args, out):
        x = args[0].reshape(-1, module.in_features)
        if module.prologue == "gelu_tanh":  # the MLP's GELU is fused: the layer is fed the pre-GELU tensor
            x = F.gelu(x, approximate="tanh")
        x = x.float()
        ref = F.linear(x, module.linear.weight.float(),
                       None if module.linear.bias is None else module.linear.bias.float())
        y = out.reshape(-1, module.out_features).float()
        cos = F.cosine_similarity(y.flatten(), ref.flatten(), dim=0).item()
        rel = ((y - ref).abs().sum() / ref.abs().sum().clamp_min(1e-30)).item()
        stats.setdefault(names[id(module)], []).append((cos, rel))

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, FP8Linear)]
    with torch.inference_mode():
        model(**inputs)
    for h in hooks:
        h.remove()
    per_layer = {n: {"cosine_min": min(c for c, _ in v), "rel_l1_max": max(r for _, r in v)}
                 for n, v in stats.items()}
    by_kind: dict[str, list[float]] = {}
    for n, v in per_layer.items():
        kind = ".".join(p for p in n.split(".") if not p.isdigit())  # e.g. transformer_blocks.attn.to_q
        by_kind.setdefault(kind, []).append(v["rel_l1_max"])
    return {"layers": per_layer,
            "worst_cosine": min(v["cosine_min"] for v in per_layer.values()),
            "worst_rel_l1": max(v["rel_l1_max"] for v in per_layer.values()),
            "median_rel_l1": statistics.median(v["rel_l1_max"] for v in per_layer.values()),
            "rel_l1_by_kind": {k: {"median": statistics.median(v), "max": max(v)} for k, v in by_kind.items()}}


def measure(name: str, args) -> dict:
    arch = archs.get_arch(name)
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cuda", seed=0)
    size = dict(height=args.height or arch.height, width=args.width or arch.width,
                frames=(args.frames or arch.frames) if arch.frames else None)
    inputs = archs.example_inputs(name, batch=arch.batch, dtype=torch.bfloat16, device="cuda", seed=1, **size)
    with torch.inference_mode():
        stock = model(**inputs)[0].float().cpu()
    out = {"model": name, "inputs": size, "batch": arch.batch}
    sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
    out["per_layer"] = _layer_errors(model, inputs)
    with torch.inference_mode():
        out["step_all_blocks_fp8"] = compare(model(**inputs)[0].float().cpu(), stock)
    sagegen.patch(model, linear="fp8")
    info = patch_info(model)["linear"]
    with torch.inference_mode():
        out["step_default_policy"] = compare(model(**inputs)[0].float().cpu(), stock)
    out["default_policy"] = {"fp8_layers": info["fp8_layer_count"], "bf16_layers": len(info["bf16_layers"]),
                             "fp8_weight_gb_added": info["fp8_weight_bytes_added"] / 1e9}
    sagegen.patch(model)
    with torch.inference_mode():
        out["step_attention_only"] = compare(model(**inputs)[0].float().cpu(), stock)
    sagegen.unpatch(model)
    print(f"{name}: per layer worst cos {out['per_layer']['worst_cosine']:.5f}, worst rel-L1 "
          f"{out['per_layer']['worst_rel_l1']:.4f} (median {out['per_layer']['median_rel_l1']:.4f}); step vs stock "
          f"rel-L1: attention only {out['step_attention_only']['rel_l1']:.4f}, + FP8 (default policy) "
          f"{out['step_default_policy']['rel_l1']:.4f}, + FP8 everywhere {out['step_all_blocks_fp8']['rel_l1']:.4f}",
          flush=True)
    del model, inputs
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", choices=sorted(archs.ARCHS), metavar="MODEL")
    p.add_argument("--out", required=True)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--frames", type=int, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fp8_layer_accuracy.py needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    report = {"benchmark": "fp8_layer_accuracy",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": {"name": props.name, "capability": list(torch.cuda.get_device_capability(0))},
              "versions": versions(), "argv": sys.argv[1:] if argv is None else argv, "results": []}
    for name in args.models:  # written after each model, so a run cut short keeps what it measured
        report["results"].append(measure(name, args))
        atomic_write_json(args.out, {**report, "partial": name != args.models[-1]})
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
