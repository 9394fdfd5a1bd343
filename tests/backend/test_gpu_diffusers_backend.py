"""GPU checks of diffusers' "sagegen" backend and the patch's backend route; skipped without CUDA.

backend="triton" throughout: "auto" runs SDPA below the measured crossover (backends.auto_prefers_sdpa).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import sagegen
from tests.conftest import gpu
from tests.support.dispatch_models import DISPATCH_MODELS
from tests.support.helpers import rel_l1
from sagegen.patch import attention_modules, patch_info

pytestmark = gpu
ad = pytest.importorskip("diffusers.models.attention_dispatch")


@pytest.fixture(autouse=True)
def _triton_backend():
    with sagegen.backend_config(backend="triton"):
        sagegen.reset_backend_stats()
        yield


def _nhd(b, s, h, d, dtype=torch.bfloat16):
    return torch.randn(b, s, h, d, device="cuda").to(dtype)


@pytest.mark.parametrize("d", [64, 128])
def test_dispatch_matches_sageattn_and_sdpa(seed, d):
    q, k, v = _nhd(1, 4096, 8, d), _nhd(1, 4096, 8, d), _nhd(1, 4096, 8, d)
    keep = torch.rand(1, 4096, device="cuda") > 0.2
    with torch.no_grad():
        out = ad.dispatch_attention_fn(q, k, v, attn_mask=keep, backend="sagegen")
    direct = sagegen.sageattn(q, k, v, tensor_layout="NHD", attn_mask=keep[:, None, None, :],
                              config=sagegen.DIFFUSION_CONFIG, backend="triton")
    assert torch.equal(out, direct)
    ref = F.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)),
                                         attn_mask=keep[:, None, None, :]).transpose(1, 2)
    assert rel_l1(out, ref) < 0.04
    assert sagegen.backend_stats() == {"routed": 1}


def test_return_lse_on_gpu(seed):
    q, k, v = _nhd(2, 1000, 4, 128), _nhd(2, 1300, 4, 128), _nhd(2, 1300, 4, 128)
    backend = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName("sagegen")]
    with torch.no_grad():
        out, lse = backend(q, k, v, return_lse=True)
    assert lse.shape == (2, 1000, 4) and lse.dtype == torch.float32
    exact = torch.logsumexp(torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(128), -1)
    assert (lse - exact.transpose(1, 2)).abs().max() < 0.05


@pytest.mark.parametrize("name", ["skyreels-v2", "ltx-video", "qwen-image", "flux.2"])  # SkyReels-V2: fused route
def test_patched_models_on_gpu_eager_and_inductor(name):
    model, inputs = DISPATCH_MODELS[name]()
    model = model.to("cuda", torch.bfloat16)
    inputs = {k: (v.to("cuda", torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point()
                  else v.to("cuda") if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    with torch.no_grad():
        ref = model(**inputs)[0]
        sagegen.patch(model, backend="triton")
        out = model(**inputs)[0]
        assert patch_info(model)["stats"]["routed"] == len(attention_modules(model))
        assert rel_l1(out, ref) < 0.05
        compiled = torch.compile(model, fullgraph=True)
        assert rel_l1(compiled(**inputs)[0], out) < 1e-2
    sagegen.unpatch(model)
