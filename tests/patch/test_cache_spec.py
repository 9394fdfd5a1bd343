"""``--cache SPEC`` (`sagegen.patch.cache_spec`) and the realised schedule (`sagegen.patch.cache_schedule`):
parsing with clear errors, diffusers' configs, and counts of what each cache computed on a patched tiny model."""

from __future__ import annotations

import json

import pytest
import torch

import sagegen
from sagegen.patch import cache_spec, cachedit
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


def test_parse_the_new_kinds():
    assert cache_spec.parse("fastercache=3").to_dict() == {"kind": "fastercache", "spatial": 3, "uncond": 5}
    assert cache_spec.parse("FasterCache=uncond:4").to_dict() == {"kind": "fastercache", "spatial": 2, "uncond": 4}
    assert cache_spec.parse("seacache=0.3").to_dict() == {"kind": "seacache", "threshold": 0.3, "order": 1,
                                                          "warmup": 1, "end": 1, "max_consecutive": 2}
    spec = cache_spec.parse("seacache=threshold:0.2,order:0,warmup:2,end:0,max_consecutive:0")
    assert cache_spec.parse(spec.text()) == spec
    if cachedit.installed_version() is None:
        pytest.skip(f"cache-dit is not installed ({cachedit.INSTALL})")
    spec = cache_spec.parse("cachedit=Fn:1,Bn:0,threshold:0.08,warmup:2")
    assert spec.to_dict() == {"kind": "cachedit", "Fn": 1, "Bn": 0, "threshold": 0.08, "warmup": 2}
    assert cache_spec.parse(spec.text()) == spec
    assert cache_spec.parse("cachedit=0.12").to_dict() == {"kind": "cachedit", "Fn": 8, "Bn": 0, "threshold": 0.12,
                                                           "warmup": 8}  # cache-dit's defaults
    spec = cache_spec.parse("cachedit=fn:2,max_cached:10,max_continuous:3,mask:fast,policy:static,taylorseer:2")
    assert spec.to_dict() == {"kind": "cachedit", "Fn": 2, "Bn": 0, "threshold": 0.08, "warmup": 8, "max_cached": 10,
                              "max_continuous": 3, "mask": "fast", "policy": "static", "taylorseer": 2}
    bound = cache_spec.bind_steps(spec, 28)
    assert bound.get("steps") == 28 and cache_spec.parse(bound.text()) == spec


def test_cachedit_options_are_cache_dits_config():
    pytest.importorskip("cache_dit")
    spec = cache_spec.bind_steps(cache_spec.parse("cachedit=Fn:2,Bn:1,threshold:0.1,warmup:3,max_cached:5,"
                                                  "max_continuous:2,mask:fast,policy:static,taylorseer:2"), 8)
    options = cachedit.options(spec)
    config = options["cache_config"]
    got = (config.Fn_compute_blocks, config.Bn_compute_blocks, config.residual_diff_threshold,
           config.max_warmup_steps, config.max_cached_steps, config.max_continuous_cached_steps)
    assert got == (2, 1, 0.1, 3, 5, 2)
    assert len(config.steps_computation_mask) == 8 == config.num_inference_steps
    assert config.steps_computation_mask[0] == 1 and config.steps_computation_policy == "static"
    assert options["calibrator_config"].taylorseer_order == 2
    mask = cachedit.options(cache_spec.parse("cachedit=mask:1011"))["cache_config"].steps_computation_mask
    assert mask == [1, 0, 1, 1]


def test_a_kind_the_installed_diffusers_lacks_names_the_version(monkeypatch):
    monkeypatch.setattr(cache_spec, "_diffusers_release", lambda: (0, 40, 0))
    with pytest.raises(cache_spec.CacheSpecError, match=r"its seacache hook needs diffusers >= 0\.41; this is "
                                                        r"diffusers 0\.40\.0"):
        cache_spec.parse("seacache=0.2")
    monkeypatch.setattr(cache_spec, "_diffusers_release", lambda: (0, 35, 2))
    with pytest.raises(cache_spec.CacheSpecError, match=r"taylorseer hook needs diffusers >= 0\.36"):
        cache_spec.parse("taylorseer=3")
    with pytest.raises(cache_spec.CacheSpecError, match=r"cache-dit needs diffusers >= 0\.36"):
        cache_spec.parse("cachedit=0.1")
    assert cache_spec.parse("fastercache=2").kind == "fastercache"  # in every supported diffusers


def test_cachedit_without_cache_dit_says_how_to_install(monkeypatch):
    monkeypatch.setattr(cachedit, "installed_version", lambda: None)
    with pytest.raises(cache_spec.CacheSpecError,
                       match=r"cache-dit is not installed \(pip install 'sagegen\[cachedit\]'\)"):
        cache_spec.parse("cachedit=Fn:1")
    monkeypatch.setattr(cachedit, "installed_version", lambda: "1.3.12")
    with pytest.raises(cache_spec.CacheSpecError, match=r"cache-dit 1\.3\.12 is older than 1\.5"):
        cache_spec.parse("cachedit=Fn:1")


def test_model_checks_before_loading():
    cache_spec.check_family(cache_spec.parse("fastercache=2"), "cogvideox")
    cache_spec.check_family(cache_spec.parse("seacache=0.2"), "wan")
    with pytest.raises(cache_spec.CacheSpecError, match="fastercache needs .* batched call .* this model is wan"):
        cache_spec.check_family(cache_spec.parse("fastercache=2"), "wan")
    with pytest.raises(cache_spec.CacheSpecError, match="seacache: .* Wan text-to-video only; this model is flux"):
        cache_spec.check_family(cache_spec.parse("seacache=0.2"), "flux")


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


def test_cachedit_mask_must_fit_the_steps():
    if cachedit.installed_version() is None:
        pytest.skip(f"cache-dit is not installed ({cachedit.INSTALL})")
    cache_spec.check_steps(cache_spec.parse("cachedit=mask:1101"), 4)
    with pytest.raises(cache_spec.CacheSpecError, match="mask:1101 has 4 steps, this run has 5"):
        cache_spec.check_steps(cache_spec.parse("cachedit=mask:1101"), 5)
    with pytest.raises(cache_spec.CacheSpecError, match="named masks need 4, 6 or >= 8 steps"):
        cache_spec.bind_steps(cache_spec.parse("cachedit=mask:fast"), 5)


@pytest.mark.parametrize("text,match", [
    ("fbcache", "write one of fbcache=THRESHOLD"), ("lru=2", "write one of"), ("fbcache=abc", "not a number"),
    ("fbcache=0", "must be > 0"), ("fbcache=nan", "must be > 0"), ("taylorseer=0", "must be >= 1"),
    ("taylorseer=interval:3,interval:4", "each at most once"), ("taylorseer=speed:2", "interval:N,order:K"),
    ("pab=1.5", "not an integer"), ("magcache=/no/such/file.json", "no such file"),
    ("fastercache=0", "must be >= 1"), ("fastercache=spatial:2,skip:3", "spatial:N,uncond:M"),
    ("seacache=order:2", "must be one of 0, 1"), ("seacache=-1", "must be > 0"),
    ("seacache=threshold:1,threshold:2", "each at most once"),
    ("cachedit=Fn:0", "must be >= 1"), ("cachedit=Fn:1,speed:2", "Fn:N,Bn:N,threshold:T"),
    ("cachedit=mask:0111", "a 0/1 string .* starting with 1"), ("cachedit=mask:quick", "one of slow, medium"),
    ("cachedit=policy:static", "applies to a mask"), ("cachedit=mask:1,policy:lazy", "one of dynamic, static"),
])
def test_bad_specs_name_what_is_wrong(text, match):
    if text.startswith("cachedit") and cachedit.installed_version() is None:
        pytest.skip(f"cache-dit is not installed ({cachedit.INSTALL})")
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
