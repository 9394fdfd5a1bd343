"""`bench_model_step.py MODEL --linear fp8` (CPU smoke mode): the attention + FP8 linears variant is timed and
reported; a bad --linear-policy is a usage error."""

from __future__ import annotations

import json

import pytest

from sagegen import stepbench


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
