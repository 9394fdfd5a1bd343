"""``--cache SPEC`` (`sagegen.patch.cache_spec`) and the realised schedule (`sagegen.patch.cache_schedule`):
parsing with clear errors, diffusers' configs, and counts of what each cache computed on a patched tiny model."""

from __future__ import annotations

import json

import pytest
import torch

import sagegen
from sagegen.patch import cache_spec
from sagegen.patch.cache_schedule import HOOK_NAME, ScheduleRecorder
from tests.support.dispatch_models import tiny_flux, tiny_wan


def test_parse_specs():
    assert cache_spec.parse("fbcache=0.08").to_dict() == {"kind": "fbcache", "threshold": 0.08}
    assert cache_spec.parse("taylorseer=3").to_dict() == {"kind": "taylorseer", "interval": 3, "order": 1,
                                                          "warmup": 3}
    spec = cache_spec.parse("TaylorSeer=interval:4,order:2,warmup:0")
    assert spec.to_dict() == {"kind": "taylorseer", "interval": 4, "order": 2, "warmup": 0}
    assert cache_spec.parse(spec.text()) == spec
    assert cache_spec.parse("pab=2").to_dict() == {"kind": "pab", "skip": 2}


def test_magcache_reads_its_ratios_file(tmp_path):
    path = tmp_path / "ratios.json"
    path.write_text(json.dumps([1.0, 0.99, 0.97, 0.95]))
    spec = cache_spec.parse(f"magcache={path}")
    assert spec.get("steps") == 4
    config = cache_spec.build(spec)
    assert list(config.mag_ratios) == [1.0, 0.99, 0.97, 0.95] and config.num_inference_steps == 4
    cache_spec.check_steps(spec, 4)
    with pytest.raises(cache_spec.CacheSpecError, match="holds 4 ratios.*this run has 10: calibrate again"):
        cache_spec.check_steps(spec, 10)


@pytest.mark.parametrize("text,match", [
    ("fbcache", "write one of fbcache=THRESHOLD"), ("lru=2", "write one of"), ("fbcache=abc", "not a number"),
    ("fbcache=0", "must be > 0"), ("fbcache=nan", "must be > 0"), ("taylorseer=0", "must be >= 1"),
    ("taylorseer=interval:3,interval:4", "each at most once"), ("taylorseer=speed:2", "interval:N,order:K"),
    ("pab=1.5", "not an integer"), ("magcache=/no/such/file.json", "no such file"),
])
def test_bad_specs_name_what_is_wrong(text, match):
    with pytest.raises(cache_spec.CacheSpecError, match=match):
        cache_spec.parse(text)


def test_magcache_file_must_hold_ratios(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"mag_ratios": [1.0, -2.0]}))
    with pytest.raises(cache_spec.CacheSpecError, match="list of >= 2 positive numbers"):
        cache_spec.parse(f"magcache={path}")


def _steps(model, inputs, n: int):
    """``n`` denoising calls at falling timesteps, as a pipeline makes them (one cache context)."""
    outs = []
    with torch.no_grad(), model.cache_context("cond"):
        for i in range(n):
            step = dict(inputs, timestep=inputs["timestep"] * (1.0 - i / (n + 1)))
            outs.append(model(**step)[0].clone())
    return outs


@pytest.mark.parametrize("order", ["patch_then_cache", "cache_then_patch"])
def test_schedule_counts_what_taylorseer_computed(order):
    """TaylorSeer with interval 3 and one warm-up step: its hooks sit on the attention modules (every one of the
    main blocks', by name: diffusers' default patterns miss Wan's ``attn1``), so the blocks run every call and
    the attention modules only on the computed steps."""
    model, inputs = tiny_wan()
    recorder = ScheduleRecorder([model])
    config = cache_spec.build(cache_spec.parse("taylorseer=interval:3,order:1,warmup:1"), model)
    if order == "patch_then_cache":
        sagegen.patch(model)
        model.enable_cache(config)
    else:
        model.enable_cache(config)
        sagegen.patch(model)
    _steps(model, inputs, 7)
    summary = recorder.summary()
    per_call = summary["attention_per_call"]
    assert summary["calls"] == 7 and summary["blocks"] == [summary["blocks_per_call"]] * 7
    computed = [a == per_call for a in summary["attention"]]
    assert sum(computed) < 7 and computed[0] and summary["attention_work"] < 1.0, summary
    sagegen.unpatch(model)
    model.disable_cache()
    recorder.remove()
    assert all(HOOK_NAME not in getattr(m, "_diffusers_hook").hooks for m in model.modules()
               if getattr(m, "_diffusers_hook", None) is not None)


def test_schedule_counts_first_block_cache_skips():
    """FirstBlockCache with a threshold every change passes: after the first call only the first block runs."""
    model, inputs = tiny_flux()
    recorder = ScheduleRecorder([model])
    sagegen.patch(model)
    model.enable_cache(cache_spec.build(cache_spec.parse("fbcache=1e9"), model))
    _steps(model, inputs, 3)
    summary = recorder.summary()
    total = summary["blocks_per_call"]
    assert total >= 2 and summary["blocks"][0] == total
    assert all(b < total for b in summary["blocks"][1:]), summary
    assert summary["block_work"] < 1.0
    sagegen.unpatch(model)
    recorder.remove()
