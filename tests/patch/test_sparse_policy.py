"""`sagegen.patch(pipe, sparse=...)` on tiny pipelines: which calls run sparse (first steps, first block,
cross-attention, text refiner, short calls dense), the latent grid, realized density, and calibration end to end.
"""

from __future__ import annotations

import json

import pytest
import torch

import sagegen
from tests.support.patching import run, tiny_pipeline
from sagegen import SparseConfig
from sagegen.patch import patch_info, reset_stats, sparse_density
from sagegen.patch.sparse_policy import latent_grid
from sagegen.jobs.calibrate import calibrate
from sagegen.sparse.text import load_calibration, parse_sparse_arg, save_calibration


@pytest.fixture
def hunyuan():
    pipe = tiny_pipeline("hunyuanvideo")
    yield pipe
    sagegen.unpatch(pipe)


def _sparse_layers(pipe):
    return {(r["step"], r["layer"]) for r in sparse_density(pipe)["per_step_layer"]}


def test_off_by_default(hunyuan):
    sagegen.patch(hunyuan, backend="reference")
    run(hunyuan, "hunyuanvideo", 0)
    assert sparse_density(hunyuan) == {}
    assert "sparse_calls" not in patch_info(hunyuan)["stats"]


def test_policy_first_steps_first_block_and_text_refiner_dense(hunyuan):
    sagegen.patch(hunyuan, backend="reference", sparse=SparseConfig(value=0.5, min_tokens=0))  # 4 steps
    run(hunyuan, "hunyuanvideo", 0)
    seen = _sparse_layers(hunyuan)
    steps = {s for s, _ in seen}
    layers = {name for _, name in seen}
    assert steps == {1, 2, 3}  # the first 25% (step 0) dense
    assert layers == {"single_transformer_blocks.0.attn"}  # block 0 and the text refiner dense
    stats = patch_info(hunyuan)["stats"]
    assert stats["sparse_calls"] == 3 and stats["sparse_dense_calls"] == 9
    d = sparse_density(hunyuan)
    assert 0 < d["overall"] <= 1 and set(d["per_step"]) == {"1", "2", "3"}
    assert hunyuan.transformer._sagegen_patch.session.sparse.grid == (3, 2, 2)


def test_policy_options_and_short_calls(hunyuan):
    cfg = SparseConfig(value=0.5, min_tokens=0, dense_steps=0.0, dense_blocks=())
    sagegen.patch(hunyuan, backend="reference", sparse=cfg)
    run(hunyuan, "hunyuanvideo", 0)
    assert {s for s, _ in _sparse_layers(hunyuan)} == {0, 1, 2, 3}  # every step sparse (steps still counted)
    assert {n for _, n in _sparse_layers(hunyuan)} == {"transformer_blocks.0.attn", "single_transformer_blocks.0.attn"}
    sagegen.patch(hunyuan, backend="reference", sparse=cfg.replace(min_tokens=10_000))  # every call is short
    reset_stats(hunyuan)
    run(hunyuan, "hunyuanvideo", 0)
    assert "sparse_calls" not in patch_info(hunyuan)["stats"]


def test_cross_attention_stays_dense():
    from sagegen.patch.sparse_policy import SparseState

    model = torch.nn.Module()
    state = SparseState(SparseConfig(min_tokens=0, dense_blocks=()), "generic", model, ["blocks.0.attn1"])
    q = torch.zeros(1, 1, 256, 64)
    assert state.for_call("blocks.0.attn1", q, torch.zeros(1, 1, 77, 64)) is None  # Nq != Nk
    assert state.for_call("blocks.0.attn2", q, q) is None  # named cross-attention
    assert state.for_call("blocks.0.attn1", q, q) is not None


def test_split_calls_sparse_and_text_rules_only_in_order():
    """Under context parallelism: `split_settings` gives the policy to every split; a call whose keys may be out
    of one process's order (a joint call without segments, or a Ring's one call of a joint call) stays dense
    where the policy keeps a text range, and runs sparse where it keeps none; a Ring's one call (``q_offset``:
    this rank's queries are a window of the gathered keys) is self-attention, with its rows' rules in place."""
    import types

    from sagegen.backend.attention import BackendSettings
    from sagegen.patch.sparse_policy import SparseState, block_mask_for, split_settings

    counts = {}
    session = types.SimpleNamespace(count=lambda k: counts.__setitem__(k, counts.get(k, 0) + 1),
                                    current_name="blocks.0.attn", config=sagegen.SageConfig())
    session.sparse = SparseState(SparseConfig(value=0.5, min_tokens=0, dense_blocks=()), "hunyuanvideo",
                                 torch.nn.Module(), ["blocks.0.attn"])
    settings = BackendSettings()
    ordered, unordered = (split_settings(session, settings, ordered=o).block_mask for o in (True, False))
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()))
    q, k = (torch.randn(1, 2, 512 + 64, 64, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    session.sparse.grid = (2, 16, 16)  # 512 video tokens, then 64 of text
    whole = ordered(q, k, None, None)
    assert whole.counts.shape == (1, 2, 9)
    assert unordered(q, k, None, None) is None and counts["sparse_dense_unordered"] == 1
    # a Ring rank's window: the second half of the queries (its last block is the text's: every key block)
    bq, nkb = whole.block_q, whole.indices.shape[-1]
    half = ordered(q[:, :, 320:], k, None, None, q_offset=320)
    assert torch.equal(half.counts, whole.counts[:, :, 320 // bq:]) and bool((half.counts[..., -1] == nkb).all())
    assert ordered(q[:, :, 320:], k, None, None) is None  # without the window it looks like cross-attention
    assert unordered(q[:, :, 320:], k, None, None, q_offset=320) is None and counts["sparse_dense_unordered"] == 2
    session.sparse.grid = None  # no text range known: top-k needs no order
    assert unordered(q, k, None, None) is not None and counts["sparse_calls"] == 3
    assert block_mask_for(session, q, k, None, None).counts.shape == (1, 2, 9)
    session.sparse = None
    assert split_settings(session, settings) is settings


def test_sparse_output_close_to_dense_on_tiny_model(hunyuan):
    sagegen.patch(hunyuan, backend="reference")
    dense = run(hunyuan, "hunyuanvideo", 3)
    sagegen.patch(hunyuan, backend="reference", sparse="cdf=1.0,min_tokens=0")  # keeps every block
    full = run(hunyuan, "hunyuanvideo", 3)
    torch.testing.assert_close(full, dense, atol=1e-3, rtol=1e-3)


def test_patch_sparse_errors(hunyuan):
    with pytest.raises(TypeError, match="sparse must be"):
        sagegen.patch(hunyuan, sparse=0.5)
    with pytest.raises(ValueError, match="start with"):
        sagegen.patch(hunyuan, sparse="fast")
    with pytest.raises(ValueError, match="number of denoising steps"):
        sagegen.patch(hunyuan.transformer, sparse=SparseConfig())  # bare transformer, dense steps unknown


def test_latent_grid_per_family():
    class Cfg:
        patch_size, patch_size_t = 2, 1

    m = torch.nn.Module()
    m.config = Cfg()
    assert latent_grid(m, "hunyuanvideo", (1, 16, 5, 90, 160)) == (5, 45, 80)
    assert latent_grid(m, "cogvideox", (1, 13, 16, 60, 90)) == (13, 30, 45)
    Cfg.patch_size = (1, 2, 2)
    assert latent_grid(m, "wan", (1, 16, 21, 90, 160)) == (21, 45, 80)
    assert latent_grid(m, "flux", (1, 4096, 64)) is None


def test_calibrate_end_to_end_and_file_round_trip(hunyuan, tmp_path):
    base = SparseConfig(mode="topk", value=0.5, min_tokens=0, dense_steps=0.0)
    result = calibrate(hunyuan, lambda: run(hunyuan, "hunyuanvideo", 0), target=0.5, base=base,
                       candidates=(0.3, 1.0), backend="reference")
    assert not sagegen.is_patched(hunyuan)
    layers = result["layers"]
    assert set(layers) == {"single_transformer_blocks.0.attn"}
    for info in layers.values():
        assert info["table"]["1.0"]["error"] < 1e-6  # every block kept: the dense result
        assert info["value"] in (0.3, 1.0) and info["calls"] == 4
    path = tmp_path / "calib.json"
    save_calibration(path, result["config"], {"layers": layers})
    cfg = parse_sparse_arg(f"calib={path},steps=0.5")
    assert cfg.layer_values == result["config"].layer_values and cfg.dense_steps == 0.5 and cfg.mode == "topk"
    assert load_calibration(path)["mode"] == "topk"
    assert json.loads(path.read_text())["format"].startswith("sagegen-sparse-calibration")
    # a layer's calibrated value reaches its calls
    sagegen.patch(hunyuan, backend="reference", sparse=cfg.replace(dense_steps=0.0))
    state = hunyuan.transformer._sagegen_patch.session.sparse
    q = torch.zeros(1, 1, 64, 64)
    assert state.for_call("single_transformer_blocks.0.attn", q, q).value == cfg.layer_values[
        "single_transformer_blocks.0.attn"]


def test_compiled_patched_model_with_sparse_runs_the_sparse_ops_once():
    """torch.compile of a transformer patched with sparse=: the mask op and the kernel op in one graph,
    compiled once for repeated calls, the eager result."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from sagegen.models import arch as archs

    name = "hunyuanvideo"
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=64, width=64,
                                  frames=9, text_tokens=archs.smoke_text_tokens(name))
    sagegen.patch(model, backend="reference", fuse_prologue=False,
                  sparse=SparseConfig(value=0.5, min_tokens=0, dense_steps=0.0))
    graphs = []

    def recorder(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    try:
        with torch.inference_mode():
            eager = model(**inputs)[0]
            compiled = torch.compile(model, backend=recorder)
            outs = [compiled(**inputs)[0] for _ in range(2)]
        assert len(graphs) == 1 and sum(counters["graph_break"].values()) == 0
        ops = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
        assert any("sparse_blocks" in o for o in ops) and any("sagegen.sageattn" in o for o in ops)
        for out in outs:
            torch.testing.assert_close(out, eager, rtol=0, atol=0)
    finally:
        torch._dynamo.reset()
        sagegen.unpatch(model)


def test_sparse_on_the_diffusers_backend_route():
    """LTX-Video dispatches through diffusers: sparse= takes effect there too (block masks, density)."""
    from sagegen.models.tiny_classes import build_tiny_class
    from sagegen.patch.patcher import patch_info, sparse_density

    model = build_tiny_class("ltx", dtype=torch.float32)
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()))
    inputs = dict(hidden_states=torch.randn(1, 2 * 16 * 16, model.config.in_channels, generator=gen),
                  encoder_hidden_states=torch.randn(1, 12, 32, generator=gen), timestep=torch.full((1,), 500.0),
                  encoder_attention_mask=torch.ones(1, 12, dtype=torch.long), num_frames=2, height=16, width=16,
                  rope_interpolation_scale=(8 / 25.0, 32, 32), return_dict=False)
    with torch.inference_mode():
        sagegen.patch(model, backend="reference")
        assert set(patch_info(model)["routes"]) == {"backend"}
        dense = model(**inputs)[0]
        sagegen.patch(model, backend="reference",
                      sparse=SparseConfig(mode="topk", value=0.25, min_tokens=0, dense_steps=0.0, dense_blocks=()))
        sparse = model(**inputs)[0]
    stats = patch_info(model)["stats"]
    assert stats.get("sparse_calls", 0) == 2, stats       # the self-attention of both blocks
    assert stats.get("sparse_dense_calls", 0) == 2, stats  # their cross-attention to the text stays dense
    density = sparse_density(model)["overall"]
    assert 0.2 < density < 0.8, density                    # 4x4 blocks of 128 tokens, a quarter kept + diagonal
    assert not torch.equal(sparse, dense) and torch.isfinite(sparse).all()
    sagegen.unpatch(model)
