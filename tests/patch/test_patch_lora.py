"""peft LoRAs on a patched pipeline (tiny Wan and Flux, random LoRAs built offline, CPU emulation):
``load_lora_weights``, ``set_adapters``, ``fuse_lora`` / ``unfuse_lora`` and ``unload_lora_weights`` before and
after `sagegen.patch`, attention only and with FP8 linears. Outputs are checked against the same LoRA on the
stock pipeline; a LoRA layer's FP8 base holds exactly the FP8 codes of the bf16 weight peft left (merged or not);
unpatch gives back the same modules and bit-identical weights, with the adapters as the user set them."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("peft", reason="peft (sagegen's `lora` extra) is not installed: this diffusers stack runs "
                                   "without LoRA support")

import sagegen  # noqa: E402
from sagegen.linear import FP8Linear, LinearPolicy, quantize_weight  # noqa: E402
from tests.support.helpers import rel_l1  # noqa: E402
from tests.support.lora import call, lora_layers, tiny_pipeline, write_lora  # noqa: E402

FAMILIES = ("wan", "flux")
EVERYWHERE = LinearPolicy(keep_blocks=(), min_rows=1)  # every block's linears, every call in FP8
TOL = {"attention": 0.05, "fp8": 0.1}  # rel. L1 of a tiny patched transformer against stock (~0.01 / ~0.03 seen)
EFFECT = 0.3  # the LoRAs move the output by more than this (rel. L1), so a lost LoRA cannot pass


def _patch(pipe, mode: str, **kw):
    if mode == "fp8":
        kw = {"linear": "fp8", "linear_policy": EVERYWHERE, **kw}
    return sagegen.patch(pipe, backend="reference", **kw)


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request, tmp_path_factory):
    """(family, unpatched pipeline, inputs, LoRA files a and b, output without LoRA)."""
    family = request.param
    pipe, inputs = tiny_pipeline(family)
    tmp = tmp_path_factory.mktemp(f"lora-{family}")
    files = {name: write_lora(pipe, family, tmp / name, seed=seed) for name, seed in (("a", 1), ("b", 2))}
    return family, pipe, inputs, files, call(pipe, inputs)


def _stock(setup, *names):
    _, pipe, _, files, _ = setup
    stock = copy.deepcopy(pipe)
    for name in names:
        stock.load_lora_weights(str(files[name]), adapter_name=name)
    return stock


def _no_lora_layer_silently_bf16(pipe):
    """Every LoRA layer's base runs FP8 or is listed bf16 with a reason."""
    info = sagegen.patch_info(pipe)["linear"]
    for name in lora_layers(pipe.transformer):
        base = f"{name}.base_layer"
        assert base in info["fp8_layers"] or info["bf16_layers"].get(base), base
    assert all(why != "unknown" for why in info["lora"]["bf16_base_layers"].values())
    return info


@pytest.mark.parametrize("mode", ["attention", "fp8"])
@pytest.mark.parametrize("order", ["load_then_patch", "patch_then_load"])
def test_lora_before_and_after_patch(setup, order, mode):
    _, pipe, inputs, files, plain = setup
    expected = call(_stock(setup, "a"), inputs)
    assert rel_l1(expected, plain) > EFFECT
    pipe = copy.deepcopy(pipe)
    if order == "load_then_patch":
        pipe.load_lora_weights(str(files["a"]), adapter_name="a")
        _patch(pipe, mode)
    else:
        _patch(pipe, mode)
        pipe.load_lora_weights(str(files["a"]), adapter_name="a")
    got = call(pipe, inputs)
    assert torch.isfinite(got).all() and rel_l1(got, expected) < TOL[mode], rel_l1(got, expected)
    assert not torch.equal(got, expected)  # sagegen ran
    if mode == "fp8":
        info = _no_lora_layer_silently_bf16(pipe)
        lora = info["lora"]
        assert lora["layers"] == len(lora_layers(pipe.transformer)) > 0
        assert lora["fp8_base_layers"] >= lora["layers"] - 1  # (Flux: the final proj_out is outside the blocks)
        assert lora["adapters"] == ["a"] and lora["loads_after_patch"] == (order == "patch_then_load")
        assert info["fp8_calls"] > 0
        bases = [m.base_layer for m in lora_layers(pipe.transformer).values()]
        assert sum(isinstance(b, FP8Linear) and b.fp8_calls > 0 for b in bases) == lora["fp8_base_layers"]


def test_two_adapters_weights_and_disable_after_patch(setup):
    _, pipe, inputs, files, plain = setup
    stock = _stock(setup, "a", "b")
    pipe = copy.deepcopy(pipe)
    pipe.load_lora_weights(str(files["a"]), adapter_name="a")
    _patch(pipe, "fp8")
    pipe.load_lora_weights(str(files["b"]), adapter_name="b")
    for p in (stock, pipe):
        p.set_adapters(["a", "b"], adapter_weights=[0.5, 1.0])
    expected = call(stock, inputs)
    assert rel_l1(expected, call(_stock(setup, "a"), inputs)) > EFFECT
    assert rel_l1(call(pipe, inputs), expected) < TOL["fp8"]
    assert sagegen.patch_info(pipe)["linear"]["lora"]["adapters"] == ["a", "b"]
    for p in (stock, pipe):
        p.disable_lora()
    assert rel_l1(call(pipe, inputs), call(stock, inputs)) < TOL["fp8"]
    assert rel_l1(call(stock, inputs), plain) == 0


def _bases_hold_the_codes_of(pipe, stock):
    """Each FP8 base holds exactly the FP8 codes of the stock LoRA layer's bf16 weight (merged or not)."""
    ref = lora_layers(stock.transformer)
    checked = 0
    for name, layer in lora_layers(pipe.transformer).items():
        if isinstance(layer.base_layer, FP8Linear):
            w_q, w_s = quantize_weight(ref[name].base_layer.weight.detach(), "per_channel")
            assert torch.equal(layer.base_layer.w_q.view(torch.uint8), w_q.view(torch.uint8)), name
            assert torch.equal(layer.base_layer.w_scale, w_s), name
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("when", ["fuse_after_patch", "fuse_before_patch"])
def test_fuse_and_unfuse_reach_the_fp8_weights(setup, when):
    _, pipe, inputs, files, _ = setup
    stock = _stock(setup, "a")
    pipe = copy.deepcopy(pipe)
    pipe.load_lora_weights(str(files["a"]), adapter_name="a")
    if when == "fuse_before_patch":
        pipe.fuse_lora(lora_scale=0.7)
        _patch(pipe, "fp8")
    else:
        _patch(pipe, "fp8")
        pipe.fuse_lora(lora_scale=0.7)
    stock.fuse_lora(lora_scale=0.7)
    _bases_hold_the_codes_of(pipe, stock)
    lora = sagegen.patch_info(pipe)["linear"]["lora"]
    assert lora["merged_layers"] == lora["layers"]
    assert lora["requantized"] == (lora["fp8_base_layers"] if when == "fuse_after_patch" else 0)
    assert rel_l1(call(pipe, inputs), call(stock, inputs)) < TOL["fp8"]

    pipe.unfuse_lora()
    stock.unfuse_lora()
    _bases_hold_the_codes_of(pipe, stock)
    lora = sagegen.patch_info(pipe)["linear"]["lora"]
    assert lora["merged_layers"] == 0 and lora["requantized"] > 0
    assert rel_l1(call(pipe, inputs), call(stock, inputs)) < TOL["fp8"]

    sagegen.unpatch(pipe)  # the bf16 weights as peft left them, bit for bit, on both
    assert _same_state(pipe.transformer, stock.transformer)


def _same_state(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("order", ["load_then_patch", "patch_then_load"])
def test_unpatch_is_exact_and_keeps_the_adapters(setup, order):
    _, pipe, inputs, files, _ = setup
    stock = _stock(setup, "a", "b")
    stock.set_adapters(["a", "b"], adapter_weights=[1.0, 0.25])
    pipe = copy.deepcopy(pipe)
    if order == "load_then_patch":
        pipe.load_lora_weights(str(files["a"]), adapter_name="a")
        pipe.load_lora_weights(str(files["b"]), adapter_name="b")
        pipe.set_adapters(["a", "b"], adapter_weights=[1.0, 0.25])
        layers = lora_layers(pipe.transformer)
        bases = {n: m.base_layer for n, m in layers.items()}
    _patch(pipe, "fp8")
    if order == "patch_then_load":
        pipe.load_lora_weights(str(files["a"]), adapter_name="a")
        pipe.load_lora_weights(str(files["b"]), adapter_name="b")
        pipe.set_adapters(["a", "b"], adapter_weights=[1.0, 0.25])
    call(pipe, inputs)
    sagegen.unpatch(pipe)
    assert not any(isinstance(m, FP8Linear) for m in pipe.transformer.modules())
    assert not any(k in pipe.transformer.__dict__ for k in ("load_lora_adapter", "add_adapter"))
    after = lora_layers(pipe.transformer)
    assert not any("merge" in m.__dict__ or "unmerge" in m.__dict__ for m in after.values())
    if order == "load_then_patch":
        assert after == layers and all(after[n].base_layer is b for n, b in bases.items())
    assert _same_state(pipe.transformer, stock.transformer)
    ref = lora_layers(stock.transformer)
    for name, layer in after.items():
        assert layer.active_adapters == ref[name].active_adapters and layer.scaling == ref[name].scaling
    assert torch.equal(call(pipe, inputs), call(stock, inputs))


def test_unload_after_patch_keeps_the_base_fp8_and_unpatch_finds_it(setup):
    _, pipe, inputs, files, plain = setup
    original = copy.deepcopy(pipe.transformer.state_dict())
    pipe = copy.deepcopy(pipe)
    pipe.load_lora_weights(str(files["a"]), adapter_name="a")
    _patch(pipe, "fp8")
    count = sagegen.patch_info(pipe)["linear"]["fp8_layer_count"]
    pipe.unload_lora_weights()  # peft puts each FP8 base where its wrapper was
    info = sagegen.patch_info(pipe)["linear"]
    assert info["fp8_layer_count"] == count and info["lora"]["layers"] == 0
    assert not any(n.endswith(".base_layer") for n in info["fp8_layers"])
    assert rel_l1(call(pipe, inputs), plain) < TOL["fp8"]
    sagegen.unpatch(pipe)
    assert not any(isinstance(m, FP8Linear) for m in pipe.transformer.modules())
    state = pipe.transformer.state_dict()
    assert state.keys() == original.keys() and all(torch.equal(state[k], original[k]) for k in state)
    assert torch.equal(call(pipe, inputs), plain)


def test_dropped_bf16_copies_refuse_a_lora_load_or_merge(setup):
    _, pipe, _, files, _ = setup
    pipe = copy.deepcopy(pipe)
    pipe.load_lora_weights(str(files["a"]), adapter_name="a")
    _patch(pipe, "fp8", linear_policy=LinearPolicy(keep_blocks=(), min_rows=1, bf16_copies="drop"))
    with pytest.raises(RuntimeError, match="bf16_copies='drop'"):
        pipe.fuse_lora()
    with pytest.raises(RuntimeError, match="bf16_copies='drop'"):
        pipe.load_lora_weights(str(files["b"]), adapter_name="b")
