"""What each of sagegen's fusions does inside a ``torch.compile`` graph of a patched model (``patch_info(...)
["compile"]``). Under compile the Python-level fusions step aside for diffusers' own ops, which inductor fuses
itself; the kernels that inductor cannot write stay in the graph as custom ops. Checked against traced graphs by
tests/patch/test_patch_compile_native.py."""

from __future__ import annotations

from sagegen.linear import module as fp8_module
from sagegen.patch.wrapper import EAGER_UNDER_COMPILE

INDUCTOR = "diffusers' ops, fused by inductor"


def describe(session, fused_blocks: int, linear_info: dict | None) -> dict:
    """One line per fusion: how it runs when the patched model is compiled."""
    report = {"attention": ("eager between graph breaks" if session.family in EAGER_UNDER_COMPILE
                            else "sagegen::sageattn op in the graph"),
              "qk_prologue": INDUCTOR if session.fuse_qk_prologue else "off",
              "block_norms_and_residuals": INDUCTOR if fused_blocks else "not fused (no fused blocks)"}
    if session.sparse is not None:
        report["block_sparse"] = "sagegen::sparse_blocks op, then sagegen::sageattn"
    if linear_info is not None and linear_info.get("fp8_layer_count"):
        per_token = linear_info["policy"]["act_granularity"] == "per_token"
        report["fp8_linears"] = ("plain ops (quantization fused by inductor) + scaled_mm"
                                 if per_token and fp8_module.COMPILE_NATIVE else "sagegen::fp8_linear op")
        report["fp8_attention_output"] = "off: the projection quantizes attention's bf16 output in the graph"
        report["qkv_one_gemm"] = "off: three GEMMs"
    return report
