"""`bench_model_step.py MODEL --linear fp8` (CPU smoke mode): the attention + FP8 linears variant is timed and
reported; a bad --linear-policy is a usage error."""

from __future__ import annotations

import json

import pytest

from sagegen.jobs.stepbench import bench as stepbench


def test_tiny_step_bench_with_fp8_linears(tmp_path):
    out = tmp_path / "step.json"
    stepbench.main(["sd3.5-medium", "--tiny", "--linear", "fp8", "--linear-policy",
                    '{"keep_blocks": [], "min_rows": 1}', "--warmup", "0", "--repeats", "1",
                    "--no-zero-attention", "--out", str(out)])
    report = json.loads(out.read_text())
    assert {"stock", "sagegen", "sagegen_fp8"} <= set(report["results"])
    assert report["linear"]["fp8_layer_count"] > 0 and report["linear"]["fp8_calls"] > 0
    assert report["linear"]["emulated"] is True
    assert report["speedup_fp8"] > 0 and report["diff_vs_stock"]["sagegen_fp8"]["cosine"] > 0.99


@pytest.mark.parametrize("policy", ['{"outliers": "clip"}', "[1]", "{bad json"])
def test_bad_linear_policy_is_a_usage_error(tmp_path, policy):
    with pytest.raises(SystemExit) as exc:
        stepbench.parse_args(["sd3.5-medium", "--tiny", "--linear", "fp8", "--linear-policy", policy,
                              "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2


def test_fp8_linear_bench_row_has_every_variant_on_cpu():
    """bench/bench_fp8_linear.py's per-shape code on the CPU (emulation, interpreter; one call per variant)."""
    import os
    import sys

    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    import bench_fp8_linear as b

    if not hasattr(torch, "_scaled_mm"):
        pytest.skip("this torch has no _scaled_mm")

    clock = iter(range(1, 10 ** 6))

    def once(fn, rep=None):  # a "time" that grows with every call
        fn()
        return float(next(clock))

    try:
        row = b.bench_shape("tiny", "ff down", 64, 256, 32, True, once, False, False, True, device="cpu", rounds=3,
                            cat_gelu_k0=64, siblings=(32, 32, 48))
    except RuntimeError as e:  # torch._scaled_mm without a CPU kernel in this torch
        pytest.skip(f"no CPU _scaled_mm: {e}")
    for k in ("bf16", "fp8_fast", "fp8_precise", "quant", "gemm_fast", "gemm_precise", "bf16_gelu",
              "fp8_gelu_eager", "fp8_gelu_fused", "bf16_cat_gelu", "fp8_cat_gelu_eager", "fp8_cat_gelu_fused"):
        assert k in row["ms"], k
    assert {"fp8_cat_gelu_eager", "fp8_cat_gelu_fused"} <= set(row["speedup"]) and row["cat_gelu_k0"] == 64
    sib = {"bf16_siblings", "bf16_siblings_merged", "fp8_siblings_shared", "fp8_siblings_merged",
           "fp8_siblings_stacked"}
    assert sib <= set(row["ms"]) and sib - {"bf16_siblings"} <= set(row["speedup"]) and row["siblings"] == [32, 32, 48]
    assert row["quant_best"]["launch"] in row["quant_sweep_ms"] and len(row["quant_sweep_ms"]) >= 2
    rounds = row["ms_rounds"]
    assert all(len(v) == 3 for v in rounds.values()) and row["ms"]["bf16"] == rounds["bf16"][1]
    want = sorted(b_ / t for b_, t in zip(rounds["bf16"], rounds["fp8_fast"]))[1]
    assert row["speedup"]["fp8_fast"] == want
    err = row["error_vs_bf16"]
    assert all(0 < err[k]["rel_l1"] < 0.1 for k in ("fp8_fast", "fp8_precise", "fp8_gelu_fused", "fp8_cat_gelu_fused",
                                                    "fp8_siblings_shared", "fp8_siblings_merged",
                                                    "fp8_siblings_stacked"))
    # merged and separate FP8 projections are the same numbers (per-channel weight scales, one activation copy)
    assert err["fp8_siblings_merged"] == pytest.approx(err["fp8_siblings_shared"], rel=1e-6)
    assert err["fp8_siblings_stacked"] == pytest.approx(err["fp8_siblings_merged"], rel=1e-6)
