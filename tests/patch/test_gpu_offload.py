"""diffusers' CPU offload on a patched pipeline (sagegen attention + FP8 linears, whose bf16 copies wait on the
host by default): model offload, sequential offload and group offload give the same latents as the same patched
pipeline kept on the GPU, and unpatching afterwards gives the stock result back."""

from __future__ import annotations

import pytest
import torch

import sagegen
from sagegen.linear import LinearPolicy, fp8_capable
from sagegen.models import tiny
from tests.conftest import gpu

pytestmark = gpu

EVERYWHERE = LinearPolicy(keep_blocks=(), min_rows=1)


def _latents(pipe, device="cuda"):
    call = dict(tiny.TINY_CALL_DEFAULTS["flux"], num_inference_steps=3, output_type="latent")
    with torch.inference_mode():
        return pipe(prompt="a red fox", generator=torch.Generator().manual_seed(0), **call)[0].float().cpu()


@pytest.mark.parametrize("offload", ["model", "sequential", "group"])
def test_offloaded_patched_pipeline_matches_the_resident_one(offload):
    ok, why = fp8_capable(torch.device("cuda"))
    if not ok:
        pytest.skip(why)
    pipe = tiny.build_tiny_pipeline("flux", dtype=torch.bfloat16).to("cuda")
    stock = _latents(pipe)
    sagegen.patch(pipe, linear="fp8", linear_policy=EVERYWHERE)
    resident = _latents(pipe)
    sagegen.unpatch(pipe)

    pipe = tiny.build_tiny_pipeline("flux", dtype=torch.bfloat16)  # on the CPU; offload moves what runs
    sagegen.patch(pipe, linear="fp8", linear_policy=EVERYWHERE)
    if offload == "model":
        pipe.enable_model_cpu_offload(device="cuda")
    elif offload == "sequential":
        pipe.enable_sequential_cpu_offload(device="cuda")
    else:
        pipe.transformer.enable_group_offload(onload_device=torch.device("cuda"), offload_device=torch.device("cpu"),
                                              offload_type="block_level", num_blocks_per_group=1)
        for name in ("text_encoder", "text_encoder_2", "vae"):
            getattr(pipe, name).to("cuda")
    offloaded = _latents(pipe)
    info = sagegen.patch_info(pipe)
    assert info["linear"]["fp8_calls"] > 0 and info["stats"].get("routed", 0) > 0
    assert torch.isfinite(offloaded).all()
    # the same kernels on the same inputs: equal, or within a rounding step where a weight moved differently
    torch.testing.assert_close(offloaded, resident, rtol=1e-2, atol=1e-2)
    sagegen.unpatch(pipe)
    assert not torch.equal(resident, stock)
