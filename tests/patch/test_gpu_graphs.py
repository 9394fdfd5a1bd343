"""CUDA graphs (`sagegen.patch(..., cuda_graphs=True)`) captured for real: replays give each call's own answer
(the eager result for those inputs), with sagegen attention, FP8 linears and a masked model; a forward that
syncs with the host falls back to eager and leaves CUDA usable; moving the model drops the graphs."""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.conftest import gpu
from tests.support.helpers import rel_l1
from sagegen.linear import LinearPolicy, fp8_capable
from sagegen.models import arch as archs
from sagegen.patch import graphs, patch_info, reset_stats

pytestmark = gpu


def _model(name, size=256):
    arch = archs.get_arch(name)
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cuda", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    dims = dict(height=size, width=size)
    if arch.frames:
        dims["frames"] = 9
    make = lambda seed: archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cuda",  # noqa: E731
                                             seed=seed, **dims)
    return model, make


def _same(a, b):
    # a replay runs the captured kernels on the copied inputs: the same bits as the eager call
    assert torch.equal(a, b), f"replay differs from eager: rel-L1 {rel_l1(a, b):.3g}"


def _counts(info) -> tuple[dict, int | None]:
    return dict(info["stats"]), (info["linear"] or {}).get("fp8_calls")


@pytest.mark.parametrize("linear", [None, "fp8"])
@pytest.mark.parametrize("name", ["flux.1-dev", "wan2.1-t2v-1.3b"])
def test_replays_answer_each_call_like_eager(name, linear):
    if linear and not fp8_capable(torch.device("cuda"))[0]:
        pytest.skip("no FP8 tensor cores")
    model, make = _model(name)
    inputs = [make(s) for s in (1, 2, 3, 4)]
    policy = LinearPolicy(keep_blocks=(), min_rows=1) if linear else None  # the smoke models have one block
    with torch.inference_mode():
        sagegen.patch(model, linear=linear, linear_policy=policy)
        reset_stats(model)
        eager = [model(**x)[0] for x in inputs]
        eager_counts = _counts(patch_info(model))
        sagegen.patch(model, linear=linear, linear_policy=policy, cuda_graphs=True)
        reset_stats(model)
        got = [model(**x)[0] for x in inputs]
        info = patch_info(model)["cuda_graphs"]
        assert info["calls"] == {"warmup": 1, "captured": 1, "replayed": 3}, info
        # a replay runs no Python: it adds what its capture counted, so the counts are the eager calls'
        assert _counts(patch_info(model)) == eager_counts and eager_counts[0].get("processor_calls"), eager_counts
        for a, b in zip(got, eager):
            _same(a, b)
        assert not torch.equal(got[1], got[2])
        # the unpatched model under the same wrapper (the benchmark's stock_graphs)
        sagegen.unpatch(model)
        stock = [model(**x)[0] for x in inputs[:3]]
        graphs.enable(model)
        for x, want in zip(inputs[:3], stock):
            _same(model(**x)[0], want)
        assert graphs.info(model)["calls"]["replayed"] == 2
        graphs.disable(model)


def test_masked_model_captures_without_the_host_side_mask_checks():
    """HunyuanVideo's text mask: the eager path simplifies it with a host sync; under capture the checks are
    skipped and the unsimplified mask gives the same attention within rounding."""
    model, make = _model("hunyuanvideo", size=128)
    x = make(1)
    with torch.inference_mode():
        sagegen.patch(model)
        eager = model(**x)[0]
        sagegen.patch(model, cuda_graphs=True)
        outs = [model(**x)[0] for _ in range(3)]
    info = patch_info(model)["cuda_graphs"]
    sagegen.unpatch(model)
    assert info["calls"].get("captured") == 1 and not info["failed"], info
    assert rel_l1(outs[-1], eager) < 1e-2, rel_l1(outs[-1], eager)


class _Syncing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64, device="cuda")

    def forward(self, x):
        y = self.lin(x)
        return y * (y.abs().max().item() > 0)  # a host sync: cannot be captured


def test_a_forward_that_syncs_runs_eagerly_and_cuda_stays_usable():
    net = _Syncing().requires_grad_(False)
    wrapper = graphs.enable(net)
    x = torch.randn(8, 64, device="cuda")
    with torch.inference_mode():
        net(x)
        with pytest.warns(RuntimeWarning, match="could not be captured"):
            out = net(x)
        assert torch.equal(out, net.lin(x))
        out = net(x)
    torch.cuda.synchronize()
    assert wrapper.stats["capture_failed"] == 1 and wrapper.stats["eager:capture_failed"] == 1
    assert torch.equal(out, net.lin(x)) and (torch.ones(4, device="cuda") * 2).sum().item() == 8
    # random ops work after the failed capture (torch left the generator in capture mode; graphs ends it)
    torch.nn.Linear(64, 64, device="cuda")
    assert torch.randn(1000, device="cuda").std().item() > 0.5
    # and a capture after it still works
    wrapper = graphs.enable(torch.nn.Linear(64, 64, device="cuda").requires_grad_(False))
    lin = wrapper.forward.__self__
    with torch.inference_mode():
        outs = [lin(x * i) for i in range(3)]
    assert wrapper.stats["replayed"] == 2 and torch.equal(outs[2],
                                                          torch.nn.functional.linear(x * 2, lin.weight, lin.bias))


class _HostValues(torch.nn.Module):
    """Small host values copied to the GPU inside the forward (Qwen-Image's text length does this)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64, device="cuda")
        self.table = torch.tensor([0.5, 2.0, -1.0, 4.0])  # a CPU buffer outside the module's tensors

    def forward(self, x, mask):
        n = torch.as_tensor(mask.shape[1], device=x.device)
        last = torch.where(mask.any(dim=1), mask.float().argmax(dim=1), n)
        return self.lin(x) * self.table.to(x.device).repeat(16) + last[:, None]


def test_small_host_values_become_graph_constants():
    net = _HostValues().requires_grad_(False)
    inputs = [(torch.randn(3, 64, device="cuda"), torch.rand(3, 10, device="cuda") > t) for t in (0.5, 0.9, 1.0, 0.2)]
    with torch.inference_mode():
        eager = [net(*x) for x in inputs]
        wrapper = graphs.enable(net)
        got = [net(*x) for x in inputs]
    assert wrapper.stats["captured"] == 1 and wrapper.stats["replayed"] == 3 and not wrapper.failed, wrapper.info()
    for a, b in zip(got, eager):
        _same(a, b)


def test_qwen_image_captures():
    """Qwen-Image's forward copied its text length from the host: it could not be captured (NOTES v5.4)."""
    model, make = _model("qwen-image", size=128)
    inputs = [make(s) for s in (1, 2, 3)]
    for x in inputs:  # the mask a caller may pass (the pipeline drops an all-True one): the host copy path
        x["encoder_hidden_states_mask"] = torch.ones(x["encoder_hidden_states"].shape[:2], dtype=torch.long,
                                                     device="cuda")
    with torch.inference_mode():
        sagegen.patch(model)
        eager = [model(**x)[0] for x in inputs]
        sagegen.patch(model, cuda_graphs=True)
        got = [model(**x)[0] for x in inputs]
    info = patch_info(model)["cuda_graphs"]
    sagegen.unpatch(model)
    assert info["calls"].get("captured") == 1 and not info["failed"], info
    # (under capture its all-valid text mask is not simplified away by a host check: equal within rounding)
    for a, b in zip(got, eager):
        assert rel_l1(a, b) < 1e-2, rel_l1(a, b)
    assert not torch.equal(got[1], got[2])


class _KeyMasked(torch.nn.Module):
    def forward(self, q, k, v, keep):
        return sagegen.sageattn(q, k, v, attn_mask=keep[:, None, None, :], backend="triton")


def test_key_padding_mask_under_capture():
    """Eagerly the Gluon kernel takes a prefix key mask as key lengths after a host check; under capture that
    check cannot run, so the Triton kernel applies the mask (tests/kernels/test_triton_interpret.py checks the
    branch)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    keep = torch.ones(2, 4096, dtype=torch.bool, device="cuda")
    keep[1, 3000:] = False
    net = _KeyMasked()
    net.register_buffer("anchor", torch.zeros(1, device="cuda"))  # the wrapper wants a module tensor on the GPU
    eager = net(q, k, v, keep)
    wrapper = graphs.enable(net)
    with torch.inference_mode():
        outs = [net(q, k, v, keep) for _ in range(3)]
    assert wrapper.stats["captured"] == 1 and not wrapper.failed, wrapper.info()
    exact = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                             attn_mask=keep[:, None, None, :])
    assert rel_l1(outs[-1], eager) < 2e-2 and rel_l1(outs[-1], exact) < 6e-2, (rel_l1(outs[-1], eager),
                                                                                rel_l1(outs[-1], exact))


def test_moving_the_model_drops_its_graphs():
    model, make = _model("flux.1-dev", size=128)
    x = make(1)
    with torch.inference_mode():
        sagegen.patch(model, cuda_graphs=True)
        model(**x), model(**x)
        assert patch_info(model)["cuda_graphs"]["graphs"] == 1
        model.to("cpu").to("cuda")  # new storage: the graph would read freed memory
        out = model(**x)[0]
        assert patch_info(model)["cuda_graphs"]["graphs"] == 0
        sagegen.patch(model)
        _same(out, model(**x)[0])
    sagegen.unpatch(model)


def test_a_step_cache_runs_the_graphed_model_eagerly_with_the_caches_answers():
    """FirstBlockCache on a graphed model: every call eager (`eager:step_cache`), the outputs those of the same
    cache on the eager patched model; without the cache the graph is captured again."""
    from diffusers.hooks import FirstBlockCacheConfig

    model, make = _model("flux.1-dev")
    inputs = [make(s) for s in (1, 2, 3)]

    def calls(context):
        with torch.inference_mode(), model.cache_context(context):
            return [model(**x)[0].clone() for x in inputs]

    with torch.inference_mode():
        sagegen.patch(model)
    model.enable_cache(FirstBlockCacheConfig(threshold=0.5))
    want = calls("eager")
    model.disable_cache()
    sagegen.patch(model, cuda_graphs=True)
    model.enable_cache(FirstBlockCacheConfig(threshold=0.5))
    got = calls("graphed")
    assert patch_info(model)["cuda_graphs"]["calls"] == {"eager:step_cache": 3}
    for g, w in zip(got, want):
        _same(g, w)
    model.disable_cache()
    with torch.inference_mode():
        [model(**x) for x in inputs]
    assert patch_info(model)["cuda_graphs"]["calls"]["captured"] == 1
    sagegen.unpatch(model)
