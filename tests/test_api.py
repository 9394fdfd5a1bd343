"""`sagegen.sageattn`'s contract: validation errors, backend choice, fallbacks, custom op, torch.compile."""

import warnings

import pytest
import torch

import sagegen
from tests.support.helpers import qkv, rel_l1
from sagegen import SageConfig
from sagegen.kernels import dispatch as backends


def _qkv(**kw):
    return qkv(1, 2, 2, 16, 16, 64, **kw)


@pytest.mark.parametrize("change, exc, words", [
    (lambda q, k, v: (q[0], k, v), ValueError, ["q must be 4-D", "[B, H, N, D]"]),
    (lambda q, k, v: (q.float(), k.float(), v.float()), TypeError, ["q.dtype", "float16", "bfloat16"]),
    (lambda q, k, v: (q, k.bfloat16(), v), TypeError, ["share a dtype"]),
    (lambda q, k, v: (q, k, v[:, :, :8]), ValueError, ["k and v must have the same shape"]),
    (lambda q, k, v: (q, k[:1].expand(1, 2, 16, 64)[:, :, :, :32], v[..., :32]), ValueError, ["head dims differ"]),
    (lambda q, k, v: (torch.zeros(2, 2, 16, 64).half(), k, v), ValueError, ["batch sizes differ"]),
    (lambda q, k, v: (torch.zeros(1, 3, 16, 64).half(), k, v), ValueError, ["multiple of k's"]),
    (lambda q, k, v: (q[..., :48], k[..., :48], v[..., :48]), ValueError, ["head dim 48", "(32, 64, 96, 128)"]),
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, ["q is empty"]),
    (lambda q, k, v: (q.numpy(), k, v), TypeError, ["q must be a torch.Tensor"]),
])
def test_bad_tensors(change, exc, words):
    q, k, v = change(*_qkv())
    with pytest.raises(exc) as err:
        sagegen.sageattn(q, k, v)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(tensor_layout="BHND"), ValueError, ["tensor_layout='BHND'", "HND", "NHD"]),
    (dict(backend="cuda"), ValueError, ["backend='cuda'", "triton", "reference"]),
    (dict(sm_scale=-1.0), ValueError, ["sm_scale"]),
    (dict(sm_scale=float("nan")), ValueError, ["sm_scale"]),
    (dict(is_causal=1), TypeError, ["is_causal"]),
    (dict(return_lse="yes"), TypeError, ["return_lse"]),
    (dict(config={"smooth_v": True}), TypeError, ["config must be a sagegen.SageConfig"]),
    (dict(attn_mask=torch.ones(3, 16, 16, dtype=torch.bool)), ValueError, ["attn_mask of shape (3, 16, 16)"]),
    (dict(attn_mask=torch.ones(16, 16, dtype=torch.int32)), TypeError, ["attn_mask.dtype"]),
    (dict(attn_mask=[[True]]), TypeError, ["attn_mask must be a torch.Tensor"]),
    (dict(sm_scale=True), ValueError, ["sm_scale must be a positive finite number"]),
    (dict(sm_scale=float("nan")), ValueError, ["sm_scale must be a positive finite number"]),
])
def test_bad_arguments(kwargs, exc, words):
    with pytest.raises(exc) as err:
        sagegen.sageattn(*_qkv(), **kwargs)
    for w in words:
        assert w in str(err.value)


def test_numpy_scalar_scale_is_a_number(seed):
    import numpy as np

    q, k, v = _qkv()
    assert torch.equal(sagegen.sageattn(q, k, v, sm_scale=np.float32(0.125)), sagegen.sageattn(q, k, v, sm_scale=0.125))


def test_layout_mismatch_is_explained():
    q = torch.zeros(1, 5, 3, 64).half()
    k = v = torch.zeros(1, 5, 2, 64).half()
    with pytest.raises(ValueError, match="is the layout right"):
        sagegen.sageattn(q, k, v, tensor_layout="NHD")


def test_config_validation():
    with pytest.raises(ValueError, match="pv_precision='fp4'"):
        SageConfig(pv_precision="fp4")
    with pytest.raises(ValueError, match="block_k=48"):
        SageConfig(block_k=48)
    with pytest.raises(ValueError, match="smooth_v must be a bool"):
        SageConfig(smooth_v=1)
    assert SageConfig().blocks(64) == (64, 128) and SageConfig(block_k=32).blocks(128) == (64, 32)
    assert SageConfig().blocks(128, (8, 9)) == (128, 64) and SageConfig().blocks(128, (9, 0)) == (64, 128)
    assert sagegen.DIFFUSION_CONFIG.smooth_v and not SageConfig().smooth_v


def test_inference_only():
    q, k, v = _qkv()
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="inference-only"):
        sagegen.sageattn(q, k, v)
    bias = torch.zeros(16, 16, requires_grad=True)  # a learnable bias would get no gradient either
    with pytest.raises(RuntimeError, match="inference-only"):
        sagegen.sageattn(q.detach(), k, v, attn_mask=bias)
    with torch.no_grad():
        assert sagegen.sageattn(q, k, v).shape == q.shape


def test_triton_backend_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setattr(sagegen.api, "triton_interpret", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        sagegen.sageattn(*_qkv(), backend="triton")


def test_auto_on_cpu_is_the_emulation(seed):
    q, k, v = _qkv()
    auto = sagegen.sageattn(q, k, v)
    ref = sagegen.sageattn(q, k, v, backend="reference")
    assert torch.equal(auto, ref)


def test_unsupported_gpu_follows_fallback_policy(monkeypatch, seed):
    """Pretend a CUDA device that the kernels cannot use: sdpa (warn once), reference, or error."""
    warned = []
    monkeypatch.setattr(backends, "describe_cuda", lambda device: (False, "compute capability 7.0 < 8.0"))

    class FakeCuda:
        device = torch.device("cuda")

    choice, _ = backends.choose(FakeCuda, "auto", SageConfig(), interpret=False, warn=warned.append)
    assert choice == "sdpa" and "7.0 < 8.0" in warned[0]
    choice, _ = backends.choose(FakeCuda, "triton", SageConfig(fallback="reference"), interpret=False,
                                warn=warned.append)
    assert choice == "reference"
    with pytest.raises(RuntimeError, match="fallback='error'"):
        backends.choose(FakeCuda, "auto", SageConfig(fallback="error"), interpret=False, warn=warned.append)


def test_sdpa_fallback_matches_math(seed):
    q, k, v = qkv(1, 4, 2, 33, 40, 64)
    mask = torch.rand(1, 1, 33, 40) > 0.3
    mask[..., 0, 0] = False  # row 0 sees only key 0 (causal): fully masked
    out = torch.empty_like(q)
    lse = backends.sdpa_attention(q, k.repeat_interleave(1, 1), v, out, sm_scale=0.125, is_causal=True,
                                  attn_mask=mask, return_lse=True)
    from sagegen.kernels.reference import attention_fp64
    from sagegen.api import normalize_mask

    ref, ref_lse = attention_fp64(q, k, v, sm_scale=0.125, is_causal=True, mask=normalize_mask(mask, 1, mask.shape[-1]))
    assert rel_l1(out, ref) < 2e-3
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin) and (lse[fin] - ref_lse[fin]).abs().max() < 1e-3
    assert torch.all(out[~fin] == 0)  # fully masked rows: zeros, as the kernels give


def test_warn_once():
    sagegen.api._warned.discard("sagegen: test message")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sagegen.api.warn_once("sagegen: test message")
        sagegen.api.warn_once("sagegen: test message")
    assert len(caught) == 1


def test_custom_op_and_compile_fullgraph(seed):
    """The op has a fake implementation, so torch.compile traces through it without a graph break."""
    assert hasattr(torch.ops.sagegen, "sageattn")
    q, k, v = qkv(1, 2, 2, 20, 24, 64, layout="NHD")

    def f(q, k, v):
        out, lse = sagegen.sageattn(q, k, v, tensor_layout="NHD", return_lse=True)
        return out * 2, lse

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v)
    eager_out, eager_lse = f(q, k, v)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert lse.shape == (1, 2, 20)
    torch.library.opcheck(torch.ops.sagegen.sageattn.default,
                          (q, k, v, None, False, 0.125, "NHD", True, "reference",
                           *sagegen.api._config_args(SageConfig())),
                          test_utils=("test_schema", "test_faketensor"))


def test_auto_uses_sdpa_below_the_measured_crossover(monkeypatch):
    monkeypatch.setattr(backends, "describe_cuda", lambda device: (True, "compute capability 9.0"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    class FakeQ:
        device = torch.device("cuda")
        shape = (1, 24, 4608, 128)  # Flux at 1024²

    pick = lambda backend, n_kv: backends.choose(FakeQ, backend, SageConfig(), interpret=False,
                                                  warn=print, n_kv=n_kv)[0]
    assert pick("auto", 4608) == "sdpa"
    assert pick("triton", 4608) == "triton"  # an explicit request is honoured
    FakeQ.shape = (2, 48, 17776, 64)  # CogVideoX-5b
    assert pick("auto", 17776) == "triton"
    assert pick("auto", 300) == "sdpa"  # cross-attention to a short text: small work per head


def test_sdpa_direct_matches_the_math_in_both_layouts(seed):
    """The path `auto` takes below the crossover on a GPU: plain SDPA, returned in the caller's layout."""
    from sagegen.kernels.reference import attention_fp64

    for layout in ("HND", "NHD"):
        q, k, v = qkv(1, 4, 2, 30, 50, 64, layout=layout)
        mask = torch.rand(1, 1, 30, 50) > 0.3
        mask[..., 4, :] = False
        out = backends.sdpa_direct(q, k, v, layout, mask, False, 0.125)
        assert out.shape == q.shape
        hnd = (lambda t: t) if layout == "HND" else (lambda t: t.transpose(1, 2))
        ref, _ = attention_fp64(hnd(q), hnd(k), hnd(v), sm_scale=0.125,
                                mask=sagegen.api.normalize_mask(mask, 1, mask.shape[-1]))
        assert rel_l1(hnd(out), ref) < 2e-3 and torch.all(hnd(out)[:, :, 4] == 0)


def test_hopper_gluon_kernel_eligibility(monkeypatch):
    """Which calls the sm90 Gluon kernel takes (the rest run the Triton kernel), with a reason for each."""
    from sagegen.kernels import launch as kernel_choice
    from sagegen.kernels.spec import MaskSpec

    monkeypatch.setattr(kernel_choice, "interpreting", lambda: False)
    applies = lambda cap=(9, 0), cfg=SageConfig(), d=128, blocks=(64, 128), causal=False, mask=MaskSpec(), \
        key_lengths=None: kernel_choice.gluon_applies(cap, cfg, d, blocks, causal, mask, key_lengths)
    assert applies() is None and applies(d=64) is None and applies(cfg=SageConfig(smooth_v=True)) is None
    assert "sm90" in applies(cap=(8, 9)) and "sm90" in applies(cap=None) and "sm90" in applies(cap=(10, 0))
    assert "causal" in applies(causal=True)
    assert "mask" in applies(mask=MaskSpec("bool", torch.ones(1, 1, 4, 4, dtype=torch.bool)))
    key = MaskSpec("key", torch.zeros(2, 8))
    assert "prefix" in applies(mask=key) and applies(mask=key, key_lengths=torch.tensor([8, 5])) is None
    assert "per-token" in applies(cfg=SageConfig(k_granularity="per_token"))
    assert "fp16" in applies(cfg=SageConfig(pv_precision="fp16"))
    assert "64x128" in applies(d=32) and "64x128" in applies(blocks=(128, 64))
    assert "64x128" in applies(blocks=(64, 64))
    monkeypatch.setattr(kernel_choice, "interpreting", lambda: True)
    assert "interpreter" in applies()


def test_capability_override_picks_the_other_generation_tiles(monkeypatch):
    from sagegen.config import PRE_HOPPER_BLOCKS
    from sagegen.kernels.spec import device_capability

    monkeypatch.setenv("SAGEGEN_CAPABILITY", "8.9")
    assert device_capability(torch.device("cuda", 0)) == (8, 9)
    assert SageConfig().blocks(128, device_capability(None)) == PRE_HOPPER_BLOCKS
    monkeypatch.setenv("SAGEGEN_CAPABILITY", "8")
    assert device_capability(None) == (8, 0)


def test_kernel_switches_reject_bad_values(monkeypatch):
    from sagegen.kernels.spec import device_capability

    monkeypatch.setenv("SAGEGEN_CAPABILITY", "ampere")
    with pytest.raises(ValueError, match="SAGEGEN_CAPABILITY='ampere'"):
        device_capability(None)
    monkeypatch.delenv("SAGEGEN_CAPABILITY")
    monkeypatch.setenv("SAGEGEN_KERNEL", "cuda")
    q, k, v = qkv(1, 2, 2, 16, 16, 32)
    if torch.cuda.is_available():  # on a GPU machine the CPU tensors would be refused first (no interpreter)
        q, k, v = q.cuda(), k.cuda(), v.cuda()
    with pytest.raises(ValueError, match="SAGEGEN_KERNEL='cuda'"):
        sagegen.sageattn(q, k, v, backend="triton")


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_output_takes_q_memory_layout_and_the_fake_op_agrees(layout, backend):
    """A processor's [B, H, N, D] views of [B, N, H, D] projections get a [B, N, H, D] buffer back (so its
    transpose + reshape needs no copy), as from SDPA's flash kernels; the registered fake gives the same
    strides (torch.compile builds on them)."""
    b, h, n, d = 1, 2, 40, 32
    base = torch.randn(b, n, h, d).to(torch.bfloat16) if layout == "HND" else torch.randn(b, h, n, d).to(torch.bfloat16)
    q = base.transpose(1, 2)  # HND: a view of NHD storage (and the other way round)
    k, v = torch.randn_like(q.float()).to(torch.bfloat16), torch.randn_like(q.float()).to(torch.bfloat16)
    out = sagegen.sageattn(q, k, v, tensor_layout=layout, backend=backend)
    assert out.stride() == q.stride() and out.transpose(1, 2).is_contiguous()
    plain = sagegen.sageattn(q.contiguous(), k, v, tensor_layout=layout, backend=backend)
    assert plain.is_contiguous() and torch.equal(out, plain)
    args = (q, k, v, None, False, d ** -0.5, layout, False, "reference", "per_token", "per_block", True, False,
            True, "fp8", "fp32", "sdpa", 64, 128)
    args = args[:8] + (backend,) + args[9:]
    torch.library.opcheck(torch.ops.sagegen.sageattn.default, args, test_utils=("test_schema", "test_faketensor"))


def test_eager_calls_skip_the_op_dispatch_but_tracers_still_see_the_op(seed, monkeypatch):
    """Eager calls run the op's body directly (the dispatch cost 20-110 us of host time a call); a compiler,
    FakeTensorMode, FlopCounterMode or a torch-function mode must still get the custom op (unless every active
    mode says it passes sagegen's calls through), and both paths give the same result."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.overrides import TorchFunctionMode
    from torch.utils.flop_counter import FlopCounterMode

    from sagegen.api import _config_args, _eager_direct

    q, k, v = qkv(1, 2, 2, 40, 56, 64, layout="NHD")
    mask = torch.rand(1, 1, 40, 56) > 0.2
    assert _eager_direct(q, k, v, mask, None, None)
    with FlopCounterMode(display=False):
        assert not _eager_direct(q, k, v)

    class Watch(TorchFunctionMode):  # as tests' AttentionSpy, below the patcher's own mode
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        assert not _eager_direct(q, k, v)

    class PassThrough(TorchFunctionMode):  # as the patch's HostConstants while a CUDA graph is captured
        sagegen_passes_through = True
        seen = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            PassThrough.seen += 1
            return func(*args, **(kwargs or {}))

    def call():
        return sagegen.sageattn(q, k, v, tensor_layout="NHD", attn_mask=mask, backend="reference")

    plain = call()
    with PassThrough():
        assert _eager_direct(q, k, v)
        # the body runs without the mode, as the op's body does: the mode sees what it sees around the op call
        seen = PassThrough.seen
        assert torch.equal(call(), plain)
        seen_direct, seen = PassThrough.seen - seen, PassThrough.seen
        monkeypatch.setattr(sagegen.api, "EAGER_DIRECT", False)
        assert torch.equal(call(), plain)
        monkeypatch.undo()
        assert seen_direct == PassThrough.seen - seen - 1  # (the op call itself)
        with Watch():
            assert not _eager_direct(q, k, v)
    with torch.device("meta"):  # a default device (torch.set_default_device) is no tracer either
        assert _eager_direct(q, k, v)
        assert torch.equal(call(), plain)
    with FakeTensorMode() as mode:
        fq = mode.from_tensor(q)
        assert not _eager_direct(fq, fq, fq)
        out = sagegen.sageattn(fq, fq, fq, tensor_layout="NHD", backend="reference")  # the op's fake impl
        assert type(out).__name__ == "FakeTensor" and out.shape == q.shape

    class Sub(torch.Tensor):
        """A tensor subclass (as DTensor is one): its own dispatch must see the op."""

    assert not _eager_direct(q.as_subclass(Sub), k, v)
    direct, lse = sagegen.sageattn(q, k, v, tensor_layout="NHD", attn_mask=mask, return_lse=True,
                                   backend="reference")
    via_op, op_lse = torch.ops.sagegen.sageattn(q, k, v, mask, False, 0.125, "NHD", True, "reference",
                                                *_config_args(SageConfig()))
    assert torch.equal(direct, via_op) and torch.equal(lse, op_lse)
    assert direct.stride() == via_op.stride()


def test_host_cdiv_and_next_power_of_2_match_triton():
    """The host-side helpers that replace Triton's (ConstexprFunctions since 3.x, ~2 us a call from Python)."""
    import triton

    from sagegen.kernels.spec import cdiv, next_power_of_2

    for a in list(range(0, 300)) + [75600, 2**31 - 1, 2**31, 3 * 2**40 + 1]:
        for b in (1, 3, 16, 64, 128):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
        if a >= 1:
            assert next_power_of_2(a) == triton.next_power_of_2(a), a


def test_the_custom_op_carries_every_sageconfig_field():
    """A field missing from the op's arguments would run its default on every call through the op (found when
    qk_rotation was added: the op dropped it and sageattn ran plain INT8)."""
    import dataclasses

    from sagegen.api import OP_CONFIG_FIELDS, _config_args, _config_from_args

    assert set(OP_CONFIG_FIELDS) == {f.name for f in dataclasses.fields(SageConfig)}
    odd = SageConfig(q_granularity="per_block", k_granularity="per_token", smooth_k=False, smooth_q=True,
                     smooth_v=True, pv_precision="fp16", pv_accum="fp22", fallback="error", block_q=32, block_k=64,
                     qk_rotation="hadamard", qk_precision="fp8")
    assert _config_from_args(*_config_args(odd)) == odd
