"""`sagegen.patch(..., cuda_graphs=True)` and `sagegen.patch.graphs` on the CPU.

No CUDA graph can be captured here, so `graphs.capture` is replaced by a recording stand-in whose replay runs
the captured function again on the graph's own inputs and writes into the captured outputs, as a real replay
writes into its buffers (and puts back the counters that Python moved: a real replay runs no Python). Like a
real capture it runs the function under `HostConstants` (a torch-function mode), and so does each replay: a
replay repeats whatever path the capture took. What these tests check is the wrapper's bookkeeping: keys,
static-input copies, cloned outputs, warm-up, invalidation, fallbacks, patch/unpatch, counters, and that a
capture takes the eager paths. tests/patch/test_gpu_graphs.py captures for real."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils import _pytree as pytree

import sagegen
from tests.conftest import interpreted
from tests.support.helpers import rel_l1
from sagegen.models import arch as archs
from sagegen.linear import LinearPolicy
from sagegen.patch import graphs, patch_info, reset_stats, set_attention_override
from sagegen.patch.host_constants import HostConstants


class _RecordedGraph:
    def __init__(self, fn):
        self.fn, self.replays = fn, 0
        self.counters = graphs.capture_counters
        self.output = self._run()

    def _run(self):
        with HostConstants("cpu"):  # as `graphs.capture` runs the forward
            return self.fn()

    def replay(self):
        before = self.counters.snapshot() if self.counters is not None else None
        for dst, src in zip(pytree.tree_leaves(self.output), pytree.tree_leaves(self._run())):
            dst.copy_(src)
        if before is not None:  # a real replay runs no Python: it moves no counter itself
            self.counters.restore(before)
        self.replays += 1


def recording_capture(fn):
    """`graphs.capture` on the CPU: runs ``fn`` once and returns a graph whose replay runs it again."""
    graph = _RecordedGraph(fn)
    return graph, graph.output


@pytest.fixture
def fake_gpu(monkeypatch):
    """Every tensor counts as on the GPU, except those listed in the returned set (by id)."""
    host: set[int] = set()
    captured: list[_RecordedGraph] = []

    def capture(fn):
        graph, output = recording_capture(fn)
        captured.append(graph)
        return graph, output

    monkeypatch.setattr(graphs, "on_gpu", lambda t: id(t) not in host)
    monkeypatch.setattr(graphs, "capture", capture)
    return host, captured


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x, *, scale=1.0, extra=None, opts=None):
        self.calls += 1
        y = self.lin(x) * scale
        return (y + extra if extra is not None else y, {"sum": y.sum(-1)})


def _net():
    torch.manual_seed(0)
    return _Net().requires_grad_(False)


def test_warm_up_then_capture_then_replay_with_fresh_inputs(fake_gpu):
    _, captured = fake_gpu
    net = _net()
    wrapper = graphs.enable(net)
    xs = [torch.randn(3, 8) for _ in range(4)]
    outs = [net(x) for x in xs]
    assert wrapper.stats == {"warmup": 1, "captured": 1, "replayed": 3}
    assert net.calls == 1 + 1 + 3  # eager warm-up, capture, then the stand-in's replays re-run the forward
    graphs.disable(net)
    for x, out in zip(xs, outs):  # each call answered for its own input, not the captured one
        want = net(x)
        assert torch.equal(out[0], want[0]) and torch.equal(out[1]["sum"], want[1]["sum"])
    assert captured[0].replays == 3


def test_outputs_are_clones_that_later_replays_do_not_touch(fake_gpu):
    net = _net()
    graphs.enable(net)
    net(torch.randn(2, 8))
    first = net(torch.randn(2, 8))[0]
    kept = first.clone()
    net(torch.randn(2, 8) * 100)
    assert torch.equal(first, kept)


def test_each_shape_and_non_tensor_value_has_its_own_graph_up_to_max_graphs(fake_gpu):
    net = _net()
    wrapper = graphs.enable(net, max_graphs=2)
    for _ in range(2):
        net(torch.randn(2, 8))
        net(torch.randn(5, 8))
    assert wrapper.stats["captured"] == 2 and len(wrapper.graphs) == 2
    x = torch.randn(2, 8)
    out = net(x, scale=3.0)  # a third key: past max_graphs, eager
    assert wrapper.stats["eager:max_graphs"] == 1
    assert torch.equal(out[0], net.lin(x) * 3.0)


def test_state_fn_selects_another_graph(fake_gpu):
    net = _net()
    state = {"full": False}
    wrapper = graphs.enable(net, state_fn=lambda: state["full"])
    x = torch.randn(2, 8)
    net(x), net(x)
    state["full"] = True
    net(x)
    assert wrapper.stats == {"warmup": 2, "captured": 1, "replayed": 1}


def test_new_parameter_storage_drops_every_graph(fake_gpu):
    net = _net()
    wrapper = graphs.enable(net)
    x = torch.randn(2, 8)
    net(x), net(x)
    assert len(wrapper.graphs) == 1
    net.lin.weight = torch.nn.Parameter(net.lin.weight.detach() * 2, requires_grad=False)  # a move or reload
    out = net(x)
    assert len(wrapper.graphs) == 0 and wrapper.stats["warmup"] == 2
    assert torch.equal(out[0], net.lin(x))


def test_cpu_tensor_arguments_autograd_and_unhashable_values_stay_eager(fake_gpu):
    host, _ = fake_gpu
    net = _net()
    wrapper = graphs.enable(net)
    x = torch.randn(2, 8)
    extra = torch.ones(8)
    host.add(id(extra))
    for _ in range(3):
        net(x, extra=extra)
    assert wrapper.stats == {"eager:cpu_tensor_argument": 3}
    net.requires_grad_(True)
    for _ in range(2):
        net(x)
    assert wrapper.stats["eager:autograd"] == 2
    with torch.no_grad():
        net(x), net(x)
    assert wrapper.stats["captured"] == 1
    net.requires_grad_(False)
    wrapper = graphs.enable(net)
    opts = {"fast"}  # neither a tensor nor a plain value: its contents could change under the same identity
    for _ in range(3):
        net(x, opts=opts)
    assert wrapper.stats == {"eager:argument_type:set": 3}
    for _ in range(3):  # nested plain values are keyed by value
        net(x, opts={"mode": ("fast", 2, None, torch.bfloat16)})
    assert wrapper.stats["captured"] == 1 and wrapper.stats["replayed"] == 2


def test_a_failed_capture_warns_once_and_the_key_stays_eager(fake_gpu, monkeypatch):
    def failing(fn):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(graphs, "capture", failing)
    net = _net()
    wrapper = graphs.enable(net)
    x = torch.randn(2, 8)
    net(x)
    with pytest.warns(RuntimeWarning, match="could not be captured .*not permitted"):
        out = net(x)
    assert torch.equal(out[0], net.lin(x))
    net(x)
    assert wrapper.stats == {"warmup": 1, "capture_failed": 1, "eager:capture_failed": 1}
    info = wrapper.info()
    assert len(info["failed"]) == 1 and "not permitted" in info["failed"][0]
    json.dumps(info)  # it goes into run manifests and bench JSON as is


def test_cpu_modules_run_eagerly_without_the_stand_in():
    net = _net()
    wrapper = graphs.enable(net)
    x = torch.randn(2, 8)
    for _ in range(3):
        assert torch.equal(net(x)[0], net.lin(x))
    assert wrapper.stats == {"eager:not_cuda": 3}


def test_disable_restores_the_class_forward_and_enable_replaces():
    net = _net()
    first = graphs.enable(net)
    second = graphs.enable(net)
    assert net.forward is second and first is not second
    graphs.disable(net)
    assert "forward" not in net.__dict__ and graphs.info(net) is None
    graphs.disable(net)  # not enabled: nothing to do

    def own_forward(x, **kwargs):
        return (x, {})

    net.forward = own_forward  # a forward set on the instance before enabling is put back
    graphs.enable(net)
    graphs.disable(net)
    assert net.forward is own_forward


def test_max_graphs_must_be_positive():
    with pytest.raises(ValueError, match="max_graphs"):
        graphs.enable(_net(), max_graphs=0)


def _tiny(name="flux.1-dev"):
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=64, width=64,
                                  text_tokens=archs.smoke_text_tokens(name))
    return model, inputs


def test_patch_with_cuda_graphs_matches_the_eager_patch_and_unpatches(fake_gpu):
    model, inputs = _tiny()
    with torch.inference_mode():
        stock = model(**inputs)[0]
        sagegen.patch(model, linear="fp8")
        eager = model(**inputs)[0]
        sagegen.patch(model, linear="fp8", cuda_graphs=True)
        outs = [model(**inputs)[0] for _ in range(3)]
        info = patch_info(model)["cuda_graphs"]
        assert info["calls"] == {"warmup": 1, "captured": 1, "replayed": 2} and info["graphs"] == 1
        for out in outs:
            assert torch.equal(out, eager)
        # a new input value goes through the same graph and gives that input's answer
        other = dict(inputs, hidden_states=inputs["hidden_states"] * -1)
        got = model(**other)[0]
        sagegen.patch(model, linear="fp8")
        assert patch_info(model)["cuda_graphs"] is None
        assert torch.equal(got, model(**other)[0])
        sagegen.patch(model, linear="fp8", cuda_graphs=True)
        set_attention_override(model, lambda q, k, v, mask, causal, scale: torch.zeros_like(q))
        model(**inputs), model(**inputs)
        set_attention_override(model, None)
        model(**inputs)  # back to the first state: a warm-up again (re-patching dropped the earlier graph)
        assert patch_info(model)["cuda_graphs"]["calls"] == {"warmup": 2, "captured": 1, "replayed": 1}
        sagegen.unpatch(model)
        assert "forward" not in model.__dict__
        assert torch.equal(model(**inputs)[0], stock)
    assert rel_l1(eager, stock) < 0.1


@interpreted
def test_captured_fp8_model_takes_the_eager_paths(fake_gpu):
    """The capture runs the same paths as the eager calls, the FP8 attention output included (it once fell back
    to the bf16 output under the capture's torch-function mode: replays then differed from eager by the FP8
    output's rounding, rel-L1 0.01-0.02, on an H200)."""
    model, inputs = _tiny()
    policy = LinearPolicy(keep_blocks=(), min_rows=1)  # the smoke model's few rows and one block run FP8
    others = [dict(inputs, hidden_states=inputs["hidden_states"] * s) for s in (-1.0, 0.5)]
    with torch.inference_mode():
        sagegen.patch(model, linear="fp8", linear_policy=policy)
        eager = [model(**x)[0] for x in (inputs, *others)]
        counts = dict(patch_info(model)["stats"])
        sagegen.patch(model, linear="fp8", linear_policy=policy, cuda_graphs=True)
        got = [model(**x)[0] for x in (inputs, inputs, *others)]
        graphed = patch_info(model)
    assert counts.get("routed_fp8_out", 0) > 0, counts  # (the double block's; the single block has no to_out)
    assert graphed["cuda_graphs"]["calls"] == {"warmup": 1, "captured": 1, "replayed": 3}
    # the same share of calls ran the FP8 output at the warm-up, in the capture and in the (stand-in) replays
    stats = {k: v - counts.get(k, 0) for k, v in graphed["stats"].items()}  # (the session's counts go on)
    assert stats.get("routed_fp8_out", 0) * counts["processor_calls"] == (
        counts["routed_fp8_out"] * stats["processor_calls"]), (counts, stats)
    for a, b in zip(got[1:], eager):
        assert torch.equal(a, b)


def _counts(model) -> tuple[dict, dict]:
    info = patch_info(model)
    return dict(info["stats"]), {name: layer["calls"] for name, layer in info["linear"]["layers"].items()}


def test_replays_count_their_calls_as_eager_calls_do(fake_gpu):
    """A replay runs no Python, so the capture's counts are added at each replay: a run as graphs reports the
    attention calls and FP8 calls an eager run reports (it once reported none: an empty manifest entry)."""
    model, inputs = _tiny()
    policy = LinearPolicy(keep_blocks=(), min_rows=1)
    with torch.inference_mode():
        sagegen.patch(model, linear="fp8", linear_policy=policy)
        reset_stats(model)
        model(**inputs)
        one_stats, one_layers = _counts(model)
        for _ in range(4):
            model(**inputs)
        eager_stats, eager_layers = _counts(model)
        sagegen.patch(model, linear="fp8", linear_policy=policy, cuda_graphs=True)
        reset_stats(model)
        assert _counts(model) == ({}, dict.fromkeys(eager_layers, 0))
        for _ in range(5):
            model(**inputs)
        graphed_stats, graphed_layers = _counts(model)
        assert patch_info(model)["cuda_graphs"]["calls"] == {"warmup": 1, "captured": 1, "replayed": 4}
        assert one_stats.get("processor_calls", 0) > 0 and sum(one_layers.values()) > 0, (one_stats, one_layers)
        assert graphed_stats == eager_stats and graphed_layers == eager_layers
        assert patch_info(model)["linear"]["fp8_calls"] == sum(eager_layers.values())
        reset_stats(model)  # then replays alone: one call's counts each
        model(**inputs)
        assert _counts(model) == (one_stats, one_layers)
    sagegen.unpatch(model)


def test_a_failed_capture_leaves_the_counters_as_one_eager_call_would(fake_gpu, monkeypatch):
    model, inputs = _tiny()

    def failing(fn):
        fn()  # the forward ran (and counted) before the capture failed
        raise RuntimeError("operation not permitted when stream is capturing")

    with torch.inference_mode():
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1))
        reset_stats(model)
        model(**inputs), model(**inputs)
        eager = _counts(model)
        sagegen.patch(model, linear="fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1), cuda_graphs=True)
        reset_stats(model)
        monkeypatch.setattr(graphs, "capture", failing)
        with pytest.warns(RuntimeWarning, match="could not be captured"):
            model(**inputs), model(**inputs)
        assert patch_info(model)["cuda_graphs"]["calls"] == {"warmup": 1, "capture_failed": 1}
        assert _counts(model) == eager and graphs.capture_counters is None
    sagegen.unpatch(model)


def test_patched_context_keeps_the_previous_cuda_graphs_setting(fake_gpu):
    model, inputs = _tiny()
    sagegen.patch(model, cuda_graphs=True)
    with sagegen.patched(model):
        assert patch_info(model)["cuda_graphs"] is None
    assert patch_info(model)["cuda_graphs"] is not None
    sagegen.unpatch(model)


def test_bad_cuda_graphs_arguments_are_refused_before_anything_changes():
    model, _ = _tiny()
    with pytest.raises(TypeError, match="cuda_graphs must be True or False"):
        sagegen.patch(model, cuda_graphs="yes")
    with pytest.raises(ValueError, match="cuda_graphs=True does not combine with sparse"):
        sagegen.patch(model, cuda_graphs=True, sparse="topk=0.5", policy=sagegen.PrecisionPolicy(num_steps=4))
    assert not sagegen.is_patched(model) and "forward" not in model.__dict__


def test_compiled_model_traces_through_the_wrapper(fake_gpu):
    model, inputs = _tiny()
    with torch.inference_mode():
        sagegen.patch(model, cuda_graphs=True)
        eager = model(**inputs)[0]
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        got = compiled(**inputs)[0]
    torch._dynamo.reset()
    assert patch_info(model)["cuda_graphs"]["calls"] == {"warmup": 1}  # the compiled call bypassed it
    assert rel_l1(got, eager) < 1e-2
    sagegen.unpatch(model)


def test_value_checks_are_allowed_in_plain_eager_code():
    assert graphs.value_checks_allowed()


def test_stateless_hooks_replay_and_any_other_hook_makes_calls_eager(fake_gpu):
    from diffusers.hooks import HookRegistry, ModelHook

    net = _net()
    wrapper = graphs.enable(net)
    HookRegistry.check_if_exists_or_initialize(net.lin).register_hook(ModelHook(), "layerwise_casting")
    for _ in range(3):
        net(torch.randn(2, 8))
    assert graphs.step_cache_on(net) is None and wrapper.stats["replayed"] == 2  # the capture's call, then one
    HookRegistry.check_if_exists_or_initialize(net.lin).register_hook(ModelHook(), "some_new_cache")
    assert graphs.step_cache_on(net) == "lin: some_new_cache"
    x = torch.randn(2, 8)
    out = net(x)
    assert wrapper.stats["eager:step_cache"] == 1 and torch.equal(out[0], net.lin(x))
    HookRegistry.check_if_exists_or_initialize(net.lin).remove_hook("some_new_cache")
    net(x)
    assert wrapper.stats["replayed"] == 3  # the cache is gone: the graph replays again
    net._is_cached = True  # cache-dit's mark on a transformer whose forward it wraps
    assert graphs.step_cache_on(net) == "<root>: cache-dit"


@pytest.mark.parametrize("order", ["graphs_then_cache", "cache_then_graphs"])
def test_a_step_cache_makes_the_graphed_model_step_aside_and_say_so(fake_gpu, order):
    """A replay would repeat the captured call's skip decision: with a cache on, every call runs eagerly, counted
    as "eager:step_cache", and the outputs are those of the same cache on the eager patched model."""
    from diffusers.hooks import FirstBlockCacheConfig

    model, inputs = _tiny()

    def two_calls(m, context):  # a full call, then one the cache serves from the first block
        with torch.inference_mode(), m.cache_context(context):
            return [m(**inputs)[0].clone() for _ in range(2)]

    with torch.inference_mode():
        sagegen.patch(model)
    model.enable_cache(FirstBlockCacheConfig(threshold=1e9))
    want = two_calls(model, "eager")
    model.disable_cache()
    if order == "graphs_then_cache":
        sagegen.patch(model, cuda_graphs=True)
        model.enable_cache(FirstBlockCacheConfig(threshold=1e9))
    else:
        model.enable_cache(FirstBlockCacheConfig(threshold=1e9))
        sagegen.patch(model, cuda_graphs=True)
    got = two_calls(model, "graphed")
    assert patch_info(model)["cuda_graphs"]["calls"] == {"eager:step_cache": 2}
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    model.disable_cache()
    with torch.inference_mode():
        model(**inputs), model(**inputs)
    assert patch_info(model)["cuda_graphs"]["calls"] == {"eager:step_cache": 2, "warmup": 1, "captured": 1,
                                                            "replayed": 1}
