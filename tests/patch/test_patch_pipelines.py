"""The patcher on tiny random-weight versions of all five pipelines (CPU: sagegen's PyTorch emulation).

Tolerance (patched vs unpatched latents after a 4-step generation, same seed):
  rel-L1 <= 0.06, cosine >= 0.998, and the error is <= 0.1 x the change from dropping attention altogether.
Why: on CPU the patched model runs the PyTorch emulation, the exact numerics of the GPU kernel (INT8 Q·Kᵀ,
FP8 P·V). One call of it is off by rel-L1 ~0.04 from fp64 at head dim 64 (the upstream SageAttention2 sm90
kernel measures 0.039 on an H200, /work/shared/anchors/attention-h200.md); through a residual transformer
and a few Euler steps that error does not grow beyond the per-call level (measured on these models over many
seeds and prompts: at most 0.026 for Mochi, 0.011 HunyuanVideo, 0.009 SD3, 0.005 CogVideoX, 0.001 Flux), so
0.06 leaves >2x margin. The relative bound guards against a vacuous pass: zeroing attention moves these
latents by 0.23-0.9 (the tiny transformers are initialised so that attention matters), and sagegen's error is
at most 0.03 of that (measured), so 0.1 leaves >3x margin while a mis-routed or dropped attention fails.
"""

from __future__ import annotations

import pytest
import torch

import sagegen
from tests.support.patching import (UNROUTED_BY_DESIGN, AttentionSpy, cosine, pipeline_roots, rel_l1, run,
                                    tiny_pipeline, zeros_attention)
from sagegen.models.tiny import TINY_FAMILIES
from sagegen.patch import attention_modules, patch_info, reset_stats, set_attention_override, step_history

RTOL_L1 = 0.06
MIN_COS = 0.998
MAX_FRACTION_OF_ATTENTION = 0.1


@pytest.fixture(params=TINY_FAMILIES)
def family(request):
    return request.param


@pytest.fixture
def pipe(family):
    p = tiny_pipeline(family)
    yield p
    sagegen.unpatch(p)  # never leak a patch into the next test


def test_patched_close_unpatch_bit_identical(family, pipe, seed):
    originals = {n: m.processor for n, m in attention_modules(pipe.transformer).items()}
    before = run(pipe, family, seed)

    assert sagegen.patch(pipe) is pipe
    assert sagegen.is_patched(pipe) and sagegen.is_patched(pipe.transformer)
    patched = run(pipe, family, seed)
    stats = patch_info(pipe)["stats"]
    assert stats.get("routed", 0) > 0 and stats.get("fallback", 0) == 0, stats
    set_attention_override(pipe, zeros_attention)
    no_attention = run(pipe, family, seed)
    set_attention_override(pipe, None)

    sagegen.unpatch(pipe)
    assert not sagegen.is_patched(pipe)
    after = run(pipe, family, seed)

    err, cos, effect = rel_l1(patched, before), cosine(patched, before), rel_l1(no_attention, before)
    print(f"{family}: rel-L1 {err:.5f} cos {cos:.6f} zero-attention rel-L1 {effect:.4f}")
    assert 0 < err <= RTOL_L1
    assert cos >= MIN_COS
    assert err <= MAX_FRACTION_OF_ATTENTION * effect
    assert torch.equal(after, before), "unpatch must restore bit-identical output"
    now = {n: m.processor for n, m in attention_modules(pipe.transformer).items()}
    assert now.keys() == originals.keys() and all(now[n] is originals[n] for n in now)


def test_spy_every_transformer_attention_goes_to_sagegen(family, pipe, seed):
    roots = pipeline_roots(pipe)
    attention_names = set(attention_modules(pipe.transformer))
    spies = {}
    for patched in (False, True):
        if patched:
            sagegen.patch(pipe)
        spy = AttentionSpy(roots)
        try:
            with spy:  # decoded output: the VAE runs too
                run(pipe, family, seed, num_inference_steps=2, output_type="pt")
        finally:
            spy.close()
        spies[patched] = spy
    stock, spy = spies[False], spies[True]

    # Unpatched: every attention module of the transformer called SDPA; nothing called sagegen.
    stock_attention = collections_of(stock.select("sdpa", "transformer"), attention_names)
    assert set(stock_attention) == attention_names
    assert not stock.select("sage")
    # Patched: each of those calls became exactly one sagegen call from the same module ...
    assert spy.modules("sage", "transformer") == stock_attention
    # ... no SDPA call is left in the transformer except the documented non-processor ones ...
    left = set(spy.modules("sdpa", "transformer"))
    assert left <= UNROUTED_BY_DESIGN.get(family, set()), left
    assert not set(spy.modules("sdpa", "transformer")) & attention_names
    # ... and nothing outside the transformer (text encoders, VAE) went to sagegen or changed.
    assert all(r["region"] == "transformer" for r in spy.select("sage"))
    for region in roots:
        if region != "transformer":
            assert spy.modules("sdpa", region) == stock.modules("sdpa", region), region
    outside = [r for r in stock.select("sdpa") if r["region"] not in ("transformer", None)]
    if family in ("hunyuanvideo", "flux", "sd3"):  # CLIP/Llama text encoders use SDPA at a kernel head dim
        assert any(r["region"].startswith("text_encoder") and r["head_dim"] == 64 for r in outside)
    if family in ("flux", "sd3"):  # their VAE's mid-block attention too (head dim 32)
        assert any(r["region"] == "vae" and r["head_dim"] == 32 for r in outside)


def collections_of(records, names):
    import collections

    return collections.Counter(r["module"] for r in records if r["module"] in names)


# Guidance as each pipeline runs it: batched CFG (CogVideoX, Mochi, SD3) or true CFG as two transformer calls
# at the same timestep (HunyuanVideo, Flux with a negative prompt) -- either way one step per timestep.
_CFG = {"hunyuanvideo": dict(negative_prompt="blurry", true_cfg_scale=2.0),
        "flux": dict(negative_prompt="blurry", true_cfg_scale=2.0)}


def test_policy_first_last_steps(family, pipe, seed):
    steps = 4
    kwargs = dict(num_inference_steps=steps, **_CFG.get(family, {}))
    calls_per_step = 2 if family in _CFG else 1
    reference = run(pipe, family, seed, **kwargs)

    # All steps in full precision: bit-identical to the unpatched pipeline.
    sagegen.patch(pipe, policy=sagegen.PrecisionPolicy(first_steps=steps))
    assert torch.equal(run(pipe, family, seed, **kwargs), reference)

    sagegen.patch(pipe, policy=sagegen.PrecisionPolicy(first_steps=1, last_steps=1))
    reset_stats(pipe)
    spy = AttentionSpy({"transformer": pipe.transformer})
    try:
        with spy:
            run(pipe, family, seed, **kwargs)
    finally:
        spy.close()
    history = step_history(pipe)
    expected = [(i, i in (0, steps - 1)) for i in range(steps) for _ in range(calls_per_step)]
    assert history == expected
    attention_names = set(attention_modules(pipe.transformer))
    n_forwards = steps * calls_per_step
    assert spy.forward_index == n_forwards - 1
    for fwd in range(n_forwards):
        step = fwd // calls_per_step
        sage = [r for r in spy.select("sage") if r["forward"] == fwd]
        sdpa = [r for r in spy.select("sdpa") if r["forward"] == fwd and r["module"] in attention_names]
        if step in (0, steps - 1):
            assert not sage and {r["module"] for r in sdpa} == attention_names
        else:
            assert not sdpa and {r["module"] for r in sage} == attention_names
    stats = patch_info(pipe)["stats"]
    per_forward = len(attention_names)
    assert stats["full_precision_calls"] == per_forward * 2 * calls_per_step
    assert stats["processor_calls"] == per_forward * (steps - 2) * calls_per_step

    # A second generation starts counting again (the scheduler installs new timesteps).
    run(pipe, family, seed, **kwargs)
    assert step_history(pipe)[len(expected):] == expected


def test_policy_blocks(family, pipe, seed):
    reference = run(pipe, family, seed, num_inference_steps=2)
    sagegen.patch(pipe, policy=sagegen.PrecisionPolicy(blocks=("*",)))
    assert torch.equal(run(pipe, family, seed, num_inference_steps=2), reference)

    sagegen.patch(pipe, policy=sagegen.PrecisionPolicy(blocks=(0,)))
    info = patch_info(pipe)
    kept = set(info["full_precision_modules"])
    first_list = next(n for n, c in pipe.transformer.named_children() if isinstance(c, torch.nn.ModuleList))
    assert any(n.startswith(f"{first_list}.0.") for n in kept)
    spy = AttentionSpy({"transformer": pipe.transformer})
    try:
        with spy:
            out = run(pipe, family, seed, num_inference_steps=2)
    finally:
        spy.close()
    assert set(spy.modules("sdpa", "transformer")) - UNROUTED_BY_DESIGN.get(family, set()) == kept
    routed = set(spy.modules("sage", "transformer"))
    assert routed and not routed & kept
    assert routed | kept == set(attention_modules(pipe.transformer))
    assert not torch.equal(out, reference)
