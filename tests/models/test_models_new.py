"""The newer model families (Wan 2.1 / 2.2; LTX-Video, Qwen-Image, HunyuanVideo-1.5 presets) on CPU: presets
and full-size architectures, the tiny offline pipelines end to end, and for Wan's class the patch's route,
output vs stock, exact unpatch and torch.compile(fullgraph=True) (the other classes: test_models_classes.py)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from typer.testing import CliRunner

import sagegen
from tests.support.helpers import graph_recorder
from tests.support.patching import rel_l1
from sagegen.cli.app import app
from sagegen.models import arch as archs
from sagegen.models import random_weights
from sagegen.models.presets import PRESETS, resolve
from sagegen.models.tiny_video import (TINY_VIDEO_CALL_DEFAULTS, TINY_VIDEO_KINDS, build_tiny_video_pipeline,
                                       build_tiny_wan_transformer)
from sagegen.patch import attention_modules, patch_info

runner = CliRunner()
WAN_PRESETS = ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"]


def test_presets_and_architectures_are_listed_with_real_token_counts():
    for name in WAN_PRESETS:
        p = resolve(name)
        assert p.hub_id.startswith("Wan-AI/") and p.hub_id.endswith("-Diffusers") and p.source
        assert archs.get_arch(name).cls == "WanTransformer3DModel"
    assert resolve("Wan-AI/Wan2.1-T2V-14B-Diffusers").name == "wan2.1-t2v-14b"
    assert resolve("wan2.2-t2v-a14b").call_kwargs == {"guidance_scale_2": 3.0}
    # self-attention tokens per sample (Wan's 512 text tokens are cross-attention)
    assert archs.tokens_per_sample("wan2.1-t2v-14b") == 75_600
    assert archs.tokens_per_sample("wan2.1-t2v-1.3b") == 32_760
    assert archs.tokens_per_sample("wan2.2-ti2v-5b") == 27_280
    for kind in TINY_VIDEO_KINDS:
        assert PRESETS[f"tiny-{kind}"].tiny
    r = runner.invoke(app, ["models", "--json"])
    assert r.exit_code == 0, r.output
    others = ["ltx-video", "qwen-image", "hunyuanvideo-1.5"]
    for name in WAN_PRESETS + others + [f"tiny-{k}" for k in TINY_VIDEO_KINDS]:
        assert f'"{name}"' in r.output


@pytest.mark.parametrize("name", ["wan2.1-t2v-14b", "wan2.2-ti2v-5b"])
def test_example_inputs_run_the_shrunk_full_config(name):
    model = archs.build_transformer(name, dtype=torch.float32, device="cpu",
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, height=64, width=64, frames=5, dtype=torch.float32, device="cpu")
    assert inputs["encoder_hidden_states"].shape == (1, 512, 4096)
    if name == "wan2.2-ti2v-5b":  # per-token timesteps, 16x VAE: 2 frames x 2 x 2 tokens
        assert inputs["timestep"].shape == (1, 8)
    with torch.no_grad():
        out = model(**inputs)[0]
    assert out.shape == inputs["hidden_states"].shape and torch.isfinite(out).all()


@pytest.mark.parametrize("kind", TINY_VIDEO_KINDS)
def test_compare_tiny_wan_end_to_end(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    out = tmp_path / "run"
    r = runner.invoke(app, ["compare", f"tiny-{kind}", "--prompt", "a red fox in the snow", "--steps", "2",
                            "--warmup", "0", "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    from sagegen.runs.directory import RunDir
    rd = RunDir(out)
    assert rd.manifest["setup"]["sage"]["rank0"]["attention_calls"].get("routed", 0) > 0
    d = TINY_VIDEO_CALL_DEFAULTS[kind]
    assert rd.manifest["setup"]["sage"]["rank0"]["attention_calls"].get("fallback", 0) == 0
    frames = rd.frames_array("sage", "p000-s0")
    assert frames.shape == (d.get("num_frames", 1), d["height"], d["width"], 3)


@pytest.mark.parametrize("name", ["wan2.1-t2v-1.3b", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"])
def test_random_weights_wan_pipeline(name):
    """--random-weights: the preset's pipeline class without its text encoder, random 512-token embeddings
    (tiny transformer and VAE in place of the full-size ones, same code path)."""
    from sagegen.jobs.generate import generate_one, make_samples
    from sagegen.models.loading import Loaded, place

    kind = {"wan2.1-t2v-1.3b": "wan2.1", "wan2.2-t2v-a14b": "wan2.2-a14b", "wan2.2-ti2v-5b": "wan2.2-ti2v"}[name]
    small = build_tiny_video_pipeline(kind, dtype=torch.bfloat16)
    pipe, overrides = random_weights.build_random_pipeline(resolve(name), dtype=torch.bfloat16,
                                                           transformer=small.transformer, vae=small.vae)
    assert (pipe.transformer_2 is not None) == (kind == "wan2.2-a14b")
    assert bool(pipe.config.expand_timesteps) == (kind == "wan2.2-ti2v")
    assert overrides("p", 0)["prompt_embeds"].shape == (1, 512, small.transformer.config.text_dim)
    place(pipe, torch.device("cpu"))
    d = TINY_VIDEO_CALL_DEFAULTS[kind]
    settings = {"steps": 2, "frames": d["num_frames"], "height": d["height"], "width": d["width"],
                "guidance": d["guidance_scale"], "negative_prompt": None, "max_sequence_length": None}
    frames, _, finite = generate_one(Loaded(pipe, "random", 0.0, overrides), resolve(name), settings,
                                     make_samples(["a fox"], [0])[0], torch.device("cpu"))
    assert frames.shape == (d["num_frames"], d["height"], d["width"], 3) and finite


def _wan_model(in_channels=16):
    model = build_tiny_wan_transformer(dtype=torch.bfloat16, in_channels=in_channels)
    gen = torch.Generator().manual_seed(3)
    inputs = dict(hidden_states=torch.randn(1, in_channels, 2, 8, 8, generator=gen).bfloat16(),
                  timestep=torch.tensor([500.0]), return_dict=False,
                  encoder_hidden_states=torch.randn(1, 512, model.config.text_dim, generator=gen).bfloat16())
    return model, inputs


@pytest.mark.parametrize("in_channels", [16, 48], ids=["wan2.1", "wan2.2-ti2v"])
def test_wan_class_route_output_and_exact_unpatch(in_channels):
    model, inputs = _wan_model(in_channels)
    with torch.no_grad():
        stock = model(**inputs)[0]
        sagegen.patch(model)
        info = patch_info(model)
        assert info["family"] == "wan"
        out = model(**inputs)[0]
        stats = dict(patch_info(model)["stats"])
        sagegen.unpatch(model)
        again = model(**inputs)[0]
    layers = len(model.blocks)
    assert stats["routed"] == 2 * layers  # self- and cross-attention of every block
    assert stats["fused_qk_prologue"] == 2 * layers  # the route: Wan's fused processor call
    assert 0 < rel_l1(out, stock) < 0.05
    assert torch.equal(again, stock)
    assert not any(type(m.processor).__name__.startswith("Sage") for m in attention_modules(model).values())


def test_wan_compiles_fullgraph_with_sageattn_in_the_graph():
    model, inputs = _wan_model()
    graphs, backend = graph_recorder()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            eager = sagegen.patch(model) and model(**inputs)[0]
            compiled = torch.compile(model, backend=backend, fullgraph=True)(**inputs)[0]
    finally:
        sagegen.unpatch(model)
        torch._dynamo.reset()
    calls = sum(1 for g in graphs for n in g.graph.nodes if n.op == "call_function" and "sageattn" in str(n.target))
    assert len(graphs) == 1 and calls == 2 * len(model.blocks)
    assert rel_l1(compiled, eager) < 0.02


def test_other_new_presets_pass_guidance_as_their_pipelines_take_it():
    """Qwen-Image's CFG is true_cfg_scale; HunyuanVideo-1.5's pipeline takes guidance from its guider (no call
    argument); LTX-Video takes guidance_scale. Token counts of their full-size architectures."""
    from sagegen.jobs.generate import call_kwargs

    settings = {"steps": 50, "guidance": 4.0, "height": 1328, "width": 1328, "frames": None}
    kw = call_kwargs(resolve("qwen-image"), settings, "a cat")
    assert kw["true_cfg_scale"] == 4.0 and "guidance_scale" not in kw
    kw = call_kwargs(resolve("hunyuanvideo-1.5"), dict(settings, frames=121), "a cat")
    assert "guidance_scale" not in kw and "true_cfg_scale" not in kw and kw["num_frames"] == 121
    assert call_kwargs(resolve("ltx-video"), dict(settings, frames=161), "a cat")["guidance_scale"] == 4.0
    assert archs.tokens_per_sample("ltx-video") == 21 * 16 * 22
    assert archs.tokens_per_sample("qwen-image") == 83 * 83 + 128
    assert archs.tokens_per_sample("hunyuanvideo-1.5-720p") == 31 * 45 * 80 + 729 + 256 + 1000
    for name in ("ltx-video", "qwen-image", "hunyuanvideo-1.5"):
        p = resolve(name)
        assert p.hub_id and p.source and archs.get_arch(name if name != "hunyuanvideo-1.5" else
                                                        "hunyuanvideo-1.5-720p").family == p.family


@pytest.mark.parametrize("name", ["ltx-video", "qwen-image", "hunyuanvideo-1.5-480p"])
def test_bench_runs_the_newer_architectures(name, tmp_path):
    """`sagegen bench MODEL --tiny`: stock vs sagegen on the shrunk full config (generic route)."""
    import json

    from sagegen.jobs.stepbench.bench import main

    out = tmp_path / "b.json"
    main([name, "--tiny", "--warmup", "0", "--repeats", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["patch_family"] == "generic" and result["patch_stats"]["routed"] > 0
    assert result["diff_vs_stock"]["sagegen"]["rel_l1"] < 0.05


def test_random_weights_is_a_usage_error_where_not_available(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    r = runner.invoke(app, ["run", "ltx-video", "--random-weights", "--prompt", "a cat"])
    assert r.exit_code == 2 and "--random-weights" in r.output and "sagegen bench ltx-video" in r.output
