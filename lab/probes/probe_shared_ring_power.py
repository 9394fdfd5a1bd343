"""Probe: does a K/V ring shared by two warpgroups (`shared_ring_kernel`: half the L2 -> shared-memory tile
traffic) make Wan2.1-14B's 720p attention faster inside a step, where the H200 sits at its 700 W cap
(lab/NOTES.md v5.6: the call alone 138 ms, in the step 147)?

Variants, in one process: `default` (gluon_attn, Q quantized in the kernel), `qpass` (gluon_attn with the separate
Q pass, which the shared-ring kernel needs), `ring` (the shared-ring kernel). For each: agreement with `default`
(bit for bit, also at an odd size), the call alone (do_bench and 40 in a row), the call after the block's bf16
GEMMs (the in-step proxy of `probe_insitu_clocks.py`), then whole Wan2.1-14B 720p steps in alternation, with one
stock step for the ratio.

    python lab/probes/probe_shared_ring_power.py --out $OUT/probe-shared-ring-power.json [--no-step]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402
import shared_ring_kernel as ring  # noqa: E402
from probe_util import bench_ms, environment, event_ms, full_size_model, wan_block_workload, write_json  # noqa: E402
from sagegen.kernels import gluon_attn  # noqa: E402

_ORIGINAL = gluon_attn.launch
ROUTED = {"ring": 0}


def _ring_launch(qq, out, lse, kv_len, *, H, group, n_q, n_k, d, block_m, block_n, smooth_v, sm_scale_log2,
                 permuted_v=True, q=None, tiles=None):
    if ring.applies(q, tiles, kv_len, block_m, d, qq.k8.shape[-1]) and lse is None:
        ROUTED["ring"] += 1
        try:
            return ring.launch(qq, out, lse, H=H, group=group, n_q=n_q, n_k=n_k, d=d, block_n=block_n,
                               smooth_v=smooth_v, sm_scale_log2=sm_scale_log2, permuted_v=permuted_v)
        except Exception as exc:  # not a build error to triton_attn: it would quietly fall back for good
            import traceback
            traceback.print_exc()
            raise RuntimeError("the shared-ring kernel failed") from exc
    return _ORIGINAL(qq, out, lse, kv_len, H=H, group=group, n_q=n_q, n_k=n_k, d=d, block_m=block_m,
                     block_n=block_n, smooth_v=smooth_v, sm_scale_log2=sm_scale_log2, permuted_v=permuted_v, q=q,
                     tiles=tiles)


def use(variant: str) -> None:
    gluon_attn.QUANT_Q_IN_KERNEL = variant == "default"
    gluon_attn.launch = _ring_launch if variant == "ring" else _ORIGINAL


VARIANTS = ("default", "qpass", "ring")


def agreement() -> dict:
    out = {}
    for shape in ((1, 75600, 40, 128), (2, 1000, 8, 128), (1, 4133, 3, 128)):
        torch.manual_seed(1)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        res = {}
        for variant in VARIANTS:
            use(variant)
            res[variant] = sagegen.sageattn(q, k, v, tensor_layout="NHD", config=sagegen.DIFFUSION_CONFIG)
        ref = sagegen.sageattn(q, k, v, tensor_layout="NHD", config=sagegen.DIFFUSION_CONFIG, backend="reference") \
            if shape[1] < 5000 else None
        out[str(shape)] = {v: {"equal_default": bool(torch.equal(res[v], res["default"])),
                               "max_abs_vs_default": (res[v].float() - res["default"].float()).abs().max().item(),
                               **({"max_abs_vs_emulation": (res[v].float() - ref.float()).abs().max().item()}
                                  if ref is not None else {})} for v in VARIANTS}
        print(shape, out[str(shape)], flush=True)
    use("default")
    return out


def attention_rows(rounds: int) -> dict:
    attn, gemms, flops = wan_block_workload()
    res = {v: {"do_bench_ms": [], "alone_ms": [], "after_gemms_ms": []} for v in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            use(variant)
            attn()
            r = res[variant]
            r["do_bench_ms"].append(bench_ms(attn))
            r["alone_ms"].append(statistics.median(event_ms(attn) for _ in range(8)))
            mixed = []
            for _ in range(8):
                gemms()
                mixed.append(event_ms(attn))
            r["after_gemms_ms"].append(statistics.median(mixed))
            print(variant, {key: round(val[-1], 2) for key, val in r.items()}, flush=True)
    use("default")
    for r in res.values():
        r["tflops_after_gemms"] = flops / statistics.median(r["after_gemms_ms"]) * 1e-9
        r["tflops_do_bench"] = flops / statistics.median(r["do_bench_ms"]) * 1e-9
    return res


def step_rows(rounds: int) -> dict:
    dev = torch.device("cuda")
    model, inputs = full_size_model("wan2.1-t2v-14b", dev)
    step = lambda: model(**inputs)[0]  # noqa: E731
    res = {"stock": [], **{v: [] for v in ("default", "ring")}}
    with torch.inference_mode():
        step()
        res["stock"].append(event_ms(step))
        print("stock", res["stock"][-1], flush=True)
        sagegen.patch(model)
        for variant in ("default", "ring"):
            use(variant)
            step()  # warm-up: compiles
        for _ in range(rounds):
            for variant in ("default", "ring"):
                use(variant)
                res[variant].append(event_ms(step))
                print(variant, res[variant][-1], "routed to ring:", ROUTED["ring"], flush=True)
    use("default")
    med = {k: statistics.median(v) for k, v in res.items()}
    return {"ms": res, "median_ms": med, "speedup_default": med["stock"] / med["default"],
            "speedup_ring": med["stock"] / med["ring"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-step", action="store_true")
    args = ap.parse_args()
    payload = {"agreement": agreement(), "attention": attention_rows(args.rounds)}
    torch.cuda.empty_cache()
    if not args.no_step:
        payload["wan14b_720p_step"] = step_rows(args.rounds)
        print(payload["wan14b_720p_step"], flush=True)
    from sagegen.kernels import launch as kernel_choice
    payload["gluon_broken"] = list(kernel_choice._gluon_broken)  # non-empty: some "default" ran the Triton kernel
    print("gluon broken:", payload["gluon_broken"], "routed to ring:", ROUTED["ring"], flush=True)
    write_json(args.out, environment=environment(), **payload)


if __name__ == "__main__":
    main()
