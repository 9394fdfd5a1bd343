"""diffusers' "sagegen" attention backend: every keyword the dispatcher hands over is honoured (checked against
SDPA within quantization error and bit-exactly against the emulation), the three diffusers entry points route
to it, no global state is left behind, and registration works in either import order (subprocesses)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import sagegen
from sagegen.backend import registry as diffusers_registry
from tests.support.dispatch_models import tiny_flux, tiny_qwenimage, tiny_wan
from tests.support.helpers import rel_l1

ad = pytest.importorskip("diffusers.models.attention_dispatch")
ROOT = Path(__file__).resolve().parents[2]
# rel. L1 of the quantized attention vs SDPA on N(0,1) inputs (as tests/kernels/test_reference.py; ~0.03 seen)
QUANT_TOL = 0.06


@pytest.fixture(autouse=True)
def _clean_backend_state():
    sagegen.reset_backend_stats()
    active = ad._AttentionBackendRegistry._active_backend
    settings = sagegen.get_backend_config()
    yield
    ad._AttentionBackendRegistry._active_backend = active
    sagegen.restore_backend_config(settings)


def _dispatch(q, k, v, backend="sagegen", **kw):
    with torch.no_grad():
        return ad.dispatch_attention_fn(q, k, v, backend=backend, **kw)


def _nhd(b, s, h, d, dtype=torch.bfloat16):
    return torch.randn(b, s, h, d).to(dtype)


def _masks(b, h, sq, sk):
    """Every mask form the models build, bool and additive; every query row keeps at least one key."""
    keep = torch.rand(b, sk) > 0.3
    keep[:, 0] = True
    full = torch.rand(b, 1, sq, sk) > 0.3
    full[..., 0] = True
    head = torch.rand(b, h, 1, sk) > 0.3
    head[..., 0] = True
    forms = {"[B,Skv]": keep, "[B,1,1,Skv]": keep[:, None, None, :], "[B,1,Sq,Skv]": full, "[B,H,1,Skv]": head}
    out = {}
    for name, m in forms.items():
        out[f"bool{name}"] = m
        out[f"additive{name}"] = torch.zeros(m.shape).masked_fill(~m, -1e4) + torch.randn(m.shape) * 0.1
    return out


def _emulation(q, k, v, mask=None, **kw):
    if mask is not None and mask.dim() == 2:
        mask = mask[:, None, None, :]
    return sagegen.sageattn(q, k, v, tensor_layout="NHD", attn_mask=mask, config=sagegen.DIFFUSION_CONFIG,
                            backend="reference", **kw)


def _sdpa(q, k, v, mask=None, **kw):
    if mask is not None and mask.dim() == 2:
        mask = mask[:, None, None, :]
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, **kw).transpose(1, 2)


@pytest.mark.parametrize("form", list(_masks(1, 1, 1, 1)))
def test_every_mask_form_matches_sdpa_and_the_emulation(form, seed):
    b, h, sq, sk, d = 2, 2, 37, 45, 64
    q, k, v = _nhd(b, sq, h, d), _nhd(b, sk, h, d), _nhd(b, sk, h, d)
    mask = _masks(b, h, sq, sk)[form]
    out = _dispatch(q, k, v, attn_mask=mask)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.equal(out, _emulation(q, k, v, mask))
    assert rel_l1(out, _sdpa(q, k, v, mask)) < QUANT_TOL
    # dropping the mask would be far off: the comparison can fail
    assert rel_l1(_dispatch(q, k, v), _sdpa(q, k, v, mask)) > 2.5 * QUANT_TOL
    assert sagegen.backend_stats() == {"routed": 2}


def test_square_padding_mask_is_reduced_and_empty_query_rows_are_zero(seed):
    """A [B, 1, S_q, S_kv] mask that is (valid query) x (valid key) runs as a key-padding mask; query rows with
    no key give zeros (SDPA: NaN)."""
    b, h, s, d = 2, 2, 40, 64
    q, k, v = _nhd(b, s, h, d), _nhd(b, s, h, d), _nhd(b, s, h, d)
    valid = torch.ones(b, s, dtype=torch.bool)
    valid[0, 30:] = False
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    out = _dispatch(q, k, v, attn_mask=mask)
    assert torch.equal(out[0, 30:], torch.zeros_like(out[0, 30:]))
    expected = _emulation(q, k, v, valid[:, None, None, :])
    assert torch.equal(out[0, :30], expected[0, :30]) and torch.equal(out[1], expected[1])
    ref = _sdpa(q, k, v, mask)
    assert rel_l1(out[0, :30], ref[0, :30]) < QUANT_TOL and rel_l1(out[1], ref[1]) < QUANT_TOL


def test_scale_causal_and_gqa_are_honoured(seed):
    b, sq, d = 1, 50, 64
    q, k, v = _nhd(b, sq, 4, d), _nhd(b, sq, 4, d), _nhd(b, sq, 4, d)
    out = _dispatch(q, k, v, scale=0.05)
    assert torch.equal(out, _emulation(q, k, v, sm_scale=0.05))
    assert rel_l1(out, _sdpa(q, k, v, scale=0.05)) < QUANT_TOL
    out = _dispatch(q, k, v, is_causal=True)
    assert torch.equal(out, _emulation(q, k, v, is_causal=True))
    assert rel_l1(out, _sdpa(q, k, v, is_causal=True)) < QUANT_TOL
    k2, v2 = _nhd(b, sq, 2, d), _nhd(b, sq, 2, d)
    out = _dispatch(q, k2, v2, enable_gqa=True)
    assert torch.equal(out, _emulation(q, k2, v2))
    assert rel_l1(out, _sdpa(q, k2, v2, enable_gqa=True)) < QUANT_TOL
    assert sagegen.backend_stats() == {"routed": 3}


@pytest.mark.parametrize("masked", [False, True])
def test_return_lse_is_natural_log_in_diffusers_layout(masked, seed):
    b, h, sq, sk, d = 2, 3, 33, 40, 64
    q, k, v = _nhd(b, sq, h, d), _nhd(b, sk, h, d), _nhd(b, sk, h, d)
    mask = _masks(b, h, sq, sk)["bool[B,Skv]"] if masked else None
    with torch.no_grad():
        out, lse = _backend_fn()(q, k, v, attn_mask=mask, return_lse=True)
    assert lse.shape == (b, sq, h) and lse.dtype == torch.float32
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], -math.inf)
    exact = torch.logsumexp(scores, dim=-1).transpose(1, 2)
    assert (lse - exact).abs().max() < 0.05
    ref_out, ref_lse = _emulation(q, k, v, mask, return_lse=True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse.transpose(1, 2))


def _backend_fn():
    return ad._AttentionBackendRegistry._backends[ad.AttentionBackendName("sagegen")]


def test_fp32_inputs_round_trip_through_bf16(seed):
    q, k, v = _nhd(1, 30, 2, 64, torch.float32), _nhd(1, 30, 2, 64, torch.float32), _nhd(1, 30, 2, 64, torch.float32)
    out = _dispatch(q, k, v)
    assert out.dtype == torch.float32
    bf = [t.bfloat16() for t in (q, k, v)]
    assert torch.equal(out, _emulation(*bf).float())
    with sagegen.backend_config(fp32_dtype=torch.float16):
        assert torch.equal(_dispatch(q, k, v), _emulation(*(t.half() for t in (q, k, v))).float())


def test_head_dim_and_dropout_fall_back_to_sdpa_and_are_counted(seed):
    q, k, v = _nhd(1, 20, 2, 40), _nhd(1, 20, 2, 40), _nhd(1, 20, 2, 40)
    out = _dispatch(q, k, v)
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    assert torch.equal(out, expected)
    out, lse = _backend_fn()(q, k, v, return_lse=True)
    exact = torch.logsumexp(torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(40), -1)
    assert (lse - exact.transpose(1, 2)).abs().max() < 1e-4
    q, k, v = _nhd(1, 20, 2, 64), _nhd(1, 20, 2, 64), _nhd(1, 20, 2, 64)
    _dispatch(q, k, v, dropout_p=0.5)
    stats = sagegen.backend_stats()
    assert stats == {"fallback": 3, "fallback:head_dim": 2, "fallback:dropout": 1}


def test_config_choice_reaches_the_kernel(seed):
    q, k, v = _nhd(1, 40, 2, 64), _nhd(1, 40, 2, 64), _nhd(1, 40, 2, 64)
    cfg = sagegen.SageConfig(smooth_v=False, k_granularity="per_token")
    with sagegen.backend_config(cfg):
        out = _dispatch(q, k, v)
    assert torch.equal(out, sagegen.sageattn(q, k, v, tensor_layout="NHD", config=cfg, backend="reference"))
    assert not torch.equal(out, _dispatch(q, k, v))  # the default (DIFFUSION_CONFIG) differs
    with pytest.raises(ValueError, match="unknown SageConfig field"):
        sagegen.set_backend_config({"smooth": True})


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def test_three_entry_points_route_and_leave_no_global_behind():
    model, inputs = tiny_wan()
    ref = _run(model, inputs)
    registry = ad._AttentionBackendRegistry
    before = registry._active_backend
    with ad.attention_backend("sagegen"):  # 1: the context manager (process-global, restored by diffusers)
        out = _run(model, inputs)
    assert sagegen.backend_stats() == {"routed": 4}  # 2 blocks x (self + cross)
    assert rel_l1(out, ref) < QUANT_TOL and not torch.equal(out, ref)
    sagegen.reset_backend_stats()
    model.blocks[1].attn2.set_attention_backend("sagegen")  # 2: one module
    one = _run(model, inputs)
    assert rel_l1(one, ref) < QUANT_TOL and not torch.equal(one, ref)
    assert sagegen.backend_stats() == {"routed": 1}
    model.blocks[1].attn2.processor._attention_backend = None
    sagegen.reset_backend_stats()
    model.set_attention_backend("sagegen")  # 3: the model (diffusers >= 0.37 sets its process-global default too)
    if hasattr(registry, "set_active_backend"):
        assert registry._active_backend == ad.AttentionBackendName("sagegen")
    assert torch.equal(_run(model, inputs), out)
    assert sagegen.backend_stats() == {"routed": 4}
    model.reset_attention_backend()
    registry._active_backend = before
    assert torch.equal(_run(model, inputs), ref)
    # use_backend: the per-model route without the global, undone on exit
    sagegen.reset_backend_stats()
    with sagegen.use_backend(model, {"smooth_v": True}):
        assert registry._active_backend == before
        assert torch.equal(_run(model, inputs), out)
        other, other_inputs = tiny_wan(seed=3)
        _run(other, other_inputs)  # another model in the process stays on its own backend
    assert sagegen.backend_stats() == {"routed": 4}
    assert all(getattr(m.processor, "_attention_backend", None) is None for m in model.modules()
               if hasattr(m, "processor"))
    assert torch.equal(_run(model, inputs), ref)


@pytest.mark.parametrize("build", [tiny_flux, tiny_qwenimage], ids=["flux", "qwenimage"])
def test_dispatching_models_route_every_attention_call(build):
    model, inputs = build()
    ref = _run(model, inputs)
    with sagegen.use_backend(model):
        out = _run(model, inputs)
    n = sum(1 for m in model.modules() if hasattr(getattr(m, "processor", None), "_attention_backend"))
    assert sagegen.backend_stats() == {"routed": n}
    assert rel_l1(out, ref) < QUANT_TOL and not torch.equal(out, ref)


def test_context_parallel_without_sagegen_parallel_says_so(monkeypatch):
    if (ROOT / "sagegen" / "parallel").exists():
        pytest.skip("sagegen.parallel is present: context parallelism is tested there")
    q = _nhd(1, 8, 2, 64)
    with pytest.raises(NotImplementedError, match="sagegen.parallel"):
        _backend_fn()(q, q, q, _parallel_config=object())


def test_an_unsupported_diffusers_gets_a_clear_error():
    fake = types.SimpleNamespace(AttentionBackendName=ad.AttentionBackendName)
    with pytest.raises(sagegen.DiffusersBackendUnavailable, match=r"diffusers 0\.\d+.*_AttentionBackendRegistry"):
        diffusers_registry._detect(fake)
    assert "sagegen" in ad._AttentionBackendRegistry._supports_context_parallel


def test_a_diffusers_without_the_dispatcher_gets_a_clear_error(monkeypatch):
    """diffusers < 0.35 has no attention_dispatch module: the error names the version and the way out, while a
    module the dispatcher itself fails to import still surfaces as itself."""
    import importlib

    real = importlib.import_module

    def missing(name, *args):
        if name == diffusers_registry.TARGET:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(sagegen.DiffusersBackendUnavailable, match=r"diffusers 0\.\d+.*no attention dispatcher"):
        sagegen.register_diffusers_backend()

    def broken(name, *args):
        if name == diffusers_registry.TARGET:
            raise ModuleNotFoundError("No module named 'httpx'", name="httpx")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="httpx"):
        sagegen.register_diffusers_backend()


# -- subprocesses: import order, DIFFUSERS_ATTN_CHECKS, DIFFUSERS_ATTN_BACKEND ---------------------------------
def _python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT),
                "TRITON_INTERPRET": "1", **env}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=600)


def test_registration_in_both_import_orders():
    code = """
import sys
import sagegen
assert "diffusers" not in sys.modules, "import sagegen must not import diffusers"
from sagegen.backend import registry as reg
assert reg.hook_installed()
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry
assert not reg.hook_installed()
assert AttentionBackendName("sagegen") in _AttentionBackendRegistry._backends
print("late-ok")
"""
    r = _python(code)
    assert r.returncode == 0 and "late-ok" in r.stdout, r.stderr
    code = """
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry
import sagegen
from sagegen.backend import registry as reg
assert not reg.hook_installed()
assert AttentionBackendName("sagegen") in _AttentionBackendRegistry._backends
print("early-ok")
"""
    r = _python(code)
    assert r.returncode == 0 and "early-ok" in r.stdout, r.stderr


def test_works_with_diffusers_attn_checks_and_env_backend_cannot_name_it():
    code = """
import torch, sagegen
from tests.support.dispatch_models import tiny_wan
from diffusers.models.attention_dispatch import _AttentionBackendRegistry
assert _AttentionBackendRegistry._checks_enabled
model, inputs = tiny_wan()
with torch.no_grad(), sagegen.use_backend(model):
    model(**inputs)
print("stats", sagegen.backend_stats())
from tests.support.dispatch_models import tiny_skyreels_v2
from sagegen.patch import targets
del targets.SUPPORTED_MODELS["SkyReelsV2Transformer3DModel"]  # Wan's interface on the backend route
model, inputs = tiny_skyreels_v2()
sagegen.patch(model)  # the patch's route hands the dispatcher one more keyword (its settings)
with torch.no_grad():
    model(**inputs)
info = sagegen.patch_info(model)
print("patched", info["routes"], info["stats"]["routed"])
"""
    r = _python(code, DIFFUSERS_ATTN_CHECKS="1")
    assert r.returncode == 0, r.stderr
    assert "stats {'routed': 4}" in r.stdout and "patched {'backend': 4} 4" in r.stdout
    assert "Removing unsupported arguments" not in r.stderr  # the dispatcher dropped nothing
    r = _python("import sagegen, diffusers.models.attention_dispatch", DIFFUSERS_ATTN_BACKEND="sagegen")
    assert r.returncode != 0 and "sagegen" in r.stderr  # read at diffusers' import, before the name exists


def test_compiled_model_with_the_backend_has_sageattn_in_one_full_graph():
    """torch.compile(fullgraph=True) of a model on the backend. The dynamo backend below runs the traced graph
    as is (no inductor codegen, slow on a 2-core CPU); it checks that the graph holds the sagegen op for every
    attention call and gives the eager result."""
    import torch._dynamo

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model, inputs = tiny_wan()
    try:
        with torch.no_grad(), sagegen.use_backend(model):
            eager = _run(model, inputs)
            compiled = torch.compile(model, fullgraph=True, backend=record)
            out = compiled(**inputs)[0]
            again = compiled(**inputs)[0]
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1  # compiled once, no recompile on the second call
    ops = sum(1 for node in graphs[0].graph.nodes if node.op == "call_function" and "sagegen" in str(node.target))
    assert ops == 4
    assert torch.equal(out, eager) and torch.equal(again, eager)
