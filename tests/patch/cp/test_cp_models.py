"""Context parallelism end to end: tiny diffusers transformers under diffusers' own enable_parallelism, on
2-4 CPU processes (gloo), with sagegen's diffusers attention backend ("sagegen", on the emulation), and
`sagegen.patch` under it. Compared with the same model in one process (sagegen) and with diffusers' native fp32
attention."""

import pytest

from tests.support import cp_patched as cp_patched_support
from tests.support import cp_route as cp_route_support
from tests.support import cp as cp_support
from sagegen.patch.cp import ContextParallelUnsupported, check_cp_support
from sagegen.parallel.collective import _validate
from sagegen.patch.cp.enable import check_heads
from sagegen.parallel.topology import Topology


def _check(res, identical=False, exact_split=False):
    e = res["rel_l1_single_vs_exact"]
    assert res["nan"] == 0
    if exact_split:    # the same split with exact attention per chunk: fp32 rounding (~2e-7) from one process.
        # HunyuanVideo-1.5 with its stock processor under Ring 2: 2.7e-3, though within 1.3x sagegen's error
        assert res["rel_l1_cp_full_vs_exact"] <= 1e-5, res
    # Ulysses computes every head as one process does (ratio ~1.0). Ring attends once over the gathered keys,
    # but the layers around attention run on chunks and a joint call's keys come in chunk order; walking the
    # chunks (SAGEGEN_RING_ONE_CALL=0) quantizes each on its own, another draw of the same size of error: up to
    # 1.29x over 150 seeds of the four Ring cases (1.3 failed ~1 run in 50), while a wrong mask or split is off
    # by several times
    assert res["rel_l1_cp_vs_exact"] <= (1.3 if identical else 1.6) * e, res
    if identical:      # Ulysses: every head over the whole sequence, as in one process. The layers around
        # attention run on sequence chunks, so fp32 rounding differs slightly and an INT8 rounding step can flip
        # (seen: 1.3% of the quantization error); a broken plan is off by several times it.
        assert res["rel_l1_vs_single"] <= 0.05 * e, res
    else:              # Ring
        assert res["rel_l1_vs_single"] <= 2.0 * e, res


def sparse_as_single(res: dict) -> None:
    """A split's sparse output against one process's (CPU). The same blocks give the same output bit for bit
    (most runs: 0.0), but the top-k ranking turns a float tie broken differently into another kept block now and
    then (a rank's head subset or rows take another path through the emulation; seen once in CI, HunyuanVideo
    under Ulysses 2: rel-L1 4.4e-4, 2% of the sparse error, the same before this session's changes). Other
    blocks than one process's (another token order, another query window) differ by a large part of it."""
    assert res["rel_l1_cp_vs_single_sparse"] <= 0.1 * res["rel_l1_single_vs_stock_sparse"], res


@pytest.mark.parametrize("one_call_env,in_order_env,sparse,expected", [
    (None, None, False, (True, True, False)), ("0", None, False, (False, True, False)),
    ("0", None, True, (True, True, True)), ("1", None, False, (True, True, False)),
    (None, "1", False, (True, True, False)), (None, "0", False, (True, False, False)),
    (None, "0", True, (True, True, True))])
def test_backend_ring_attends_once_unless_told(monkeypatch, one_call_env, in_order_env, sparse, expected):
    """sagegen's backend asks its CP for one Ring call over the gathered keys; SAGEGEN_RING_ONE_CALL=0 walks the
    chunks for dense calls (block-sparse ones always attend once: the predictor ranks every key). Joint calls
    gather their keys in one process's order (``ring_in_order``; SAGEGEN_RING_IN_ORDER=0 keeps chunk order for
    dense ones), and only block-sparse ones attend part by part (``ring_part_calls``)."""
    import torch

    import sagegen.parallel
    from sagegen.backend import attention as db

    seen = {}
    monkeypatch.setattr(sagegen.parallel, "context_parallel_attention",
                        lambda *a, **kw: seen.update(kw) or a[0])
    for name, env in ((db.RING_ONE_CALL_ENV, one_call_env), (db.RING_IN_ORDER_ENV, in_order_env)):
        if env is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, env)
    settings = db.BackendSettings(block_mask=(lambda *a, **kw: None) if sparse else None)
    q = torch.zeros(1, 4, 2, 64)
    db._context_parallel(q, q, q, None, 0.0, False, None, False, False, object(), settings)
    assert (seen["ring_one_call"], seen["ring_in_order"], seen["ring_part_calls"]) == expected


def test_flux_ring_2(tmp_path, seed):
    _check(cp_support.run_model(tmp_path, "flux", ulysses=1, ring=2, seed=seed))


def test_hunyuanvideo_ulysses_2_with_sagegen_plan(tmp_path, seed):
    # sagegen's plan and joint-mask hook: without the hook this differs from one process by ~6x sagegen's error
    _check(cp_support.run_model(tmp_path, "hunyuanvideo", ulysses=2, ring=1, seed=seed), identical=True)


@pytest.mark.slow
def test_hunyuanvideo_ulysses_2_over_two_key_blocks(tmp_path, seed):
    """256 video tokens (two K quantization blocks) through diffusers' backend route: the all-to-all hands the
    joint call its keys in chunk order ([video 0, text 0, video 1, text 1]), so some keys sit in other INT8 blocks
    than on one process: measured 0.44x sagegen's error from one process, as accurate against exact attention.
    (The case above fits in one block and cannot see this; docs/context-parallel.md says which calls are
    bit-identical.)"""
    res = cp_support.run_model(tmp_path, "hunyuanvideo_long", ulysses=2, ring=1, seed=seed)
    _check(res)
    assert res["rel_l1_vs_single"] > 0, res  # a different draw, not the same blocks


def test_hunyuanvideo_ring_2_text_padding(tmp_path, seed):
    _check(cp_support.run_model(tmp_path, "hunyuanvideo", ulysses=1, ring=2, seed=seed))


@pytest.mark.slow
def test_hunyuanvideo_ulysses_2_ring_2(tmp_path, seed):
    # 4 ranks: batch 0's text chunks 2 and 3 are wholly padding
    _check(cp_support.run_model(tmp_path, "hunyuanvideo", ulysses=2, ring=2, seed=seed))


def test_hunyuanvideo15_ulysses_2(tmp_path, seed):
    # sagegen's plan, text split and key-mask processor; the stock processor's local query x key mask fails this
    _check(cp_support.run_model(tmp_path, "hunyuanvideo15", ulysses=2, ring=1, seed=seed), identical=True,
           exact_split=True)


def test_hunyuanvideo15_ring_2_text_padding(tmp_path, seed):
    # 23 text tokens padded to 24; rank 1 holds only padding text for batch 0
    _check(cp_support.run_model(tmp_path, "hunyuanvideo15", ulysses=1, ring=2, seed=seed), exact_split=True)


def test_hunyuanvideo15_i2v_ring_2(tmp_path, seed):
    # image-to-video: the 5 image tokens are valid keys, first in the text
    _check(cp_support.run_model(tmp_path, "hunyuanvideo15_i2v", ulysses=1, ring=2, seed=seed), exact_split=True)


def test_hunyuanvideo15_ulysses_2_ring_2(tmp_path, seed):
    # ~35 s on 4 CPU processes. 4 ranks: batch 0's text chunks 2 and 3 are wholly padding
    _check(cp_support.run_model(tmp_path, "hunyuanvideo15", ulysses=2, ring=2, seed=seed), exact_split=True)


@pytest.mark.slow
def test_flux_ulysses_2(tmp_path, seed):
    _check(cp_support.run_model(tmp_path, "flux", ulysses=2, ring=1, seed=seed), identical=True)


def test_support_by_class():
    import diffusers

    assert check_cp_support(diffusers.FluxTransformer2DModel) == "diffusers"
    assert check_cp_support(diffusers.WanTransformer3DModel) == "diffusers"
    assert check_cp_support(diffusers.HunyuanVideoTransformer3DModel) == "sagegen"
    assert check_cp_support(diffusers.HunyuanVideo15Transformer3DModel) == "sagegen"
    for cls, why in [(diffusers.CogVideoXTransformer3DModel, "scaled_dot_product_attention directly"),
                     (diffusers.MochiTransformer3DModel, "directly"),
                     (diffusers.SD3Transformer2DModel, "directly"),
                     (diffusers.SkyReelsV2Transformer3DModel, "cross-attention")]:
        with pytest.raises(ContextParallelUnsupported, match=why):
            check_cp_support(cls)
    with pytest.raises(ContextParallelUnsupported, match="no context-parallel plan"):
        check_cp_support(diffusers.UNet2DConditionModel)


def test_heads_and_unsupported_arguments():
    import torch

    with pytest.raises(ValueError, match=r"heads \(2\).*Ulysses degree"):
        check_heads(2, 3)
    check_heads(24, 4)
    topo = Topology(ulysses=4, ring=1, ulysses_rank=0, ring_rank=0, ulysses_group=None, ring_group=None,
                    flat_group=None)
    q = torch.zeros(1, 8, 6, 64)
    with pytest.raises(ValueError, match=r"heads \(6\) to be a multiple of ulysses_degree \(4\)"):
        _validate(q, q, q, False, False, topo)
    with pytest.raises(ValueError, match="is_causal"):
        _validate(q, q, q, True, False, topo)
    with pytest.raises(ValueError, match="grouped-query"):
        _validate(q, q[:, :, :2], q[:, :, :2], False, False, topo)


@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_wan_under_context_parallelism(tmp_path, seed, ulysses, ring):
    """`sagegen.patch` under diffusers' context parallelism (tiny Wan, 2 gloo processes): the fused Q/K
    prologue still runs on every attention and hands self-attention to diffusers' dispatcher (sagegen's CP),
    cross-attention stays local, FP8 linears work on each rank's tokens, and the output matches one process."""
    check_patched_wan(cp_patched_support.run_patched_wan(tmp_path, ulysses=ulysses, ring=ring, seed=seed), ring)


def check_patched_wan(res: dict, ring: int, bitwise: bool = True) -> None:
    """``bitwise``: Ulysses must equal one process exactly (CPU); on the GPU a GEMM over a rank's half of the
    tokens may pick another cuBLAS kernel than over all of them, so the linears' roundings may differ."""
    layers = res["layers"]
    assert res["nan"] == 0
    chosen = res["stats_backend_chosen"]
    assert chosen["fused_qk_prologue"] == 2 * layers and not chosen.get("unrouted_processor_calls"), chosen
    assert res["backend_chosen_equal"], res
    for linear in ("None", "fp8"):
        single, cp = res[f"stats_cp0_{linear}"], res[f"stats_cp1_{linear}"]
        assert single["fused_qk_prologue"] == 2 * layers and "context_parallel" not in single, single
        # every attention fused; the self-attention calls split over the ranks, the cross-attention ones local
        assert cp["fused_qk_prologue"] == 2 * layers, cp
        assert cp["context_parallel"] == layers and cp["routed"] >= layers, cp
        assert not cp.get("unrouted_processor_calls") and not cp.get("fallback"), cp
        err = res[f"rel_l1_single_vs_stock_{linear}"]
        assert 0 < err < 0.1
        # Ulysses: bit-identical to one process (each rank runs the same calls on its heads; the first block,
        # hooked by diffusers' CP plan before the patch, runs the fused forward too: `fused_common.swap_class`).
        # Ring: one call of the rank's queries over the gathered keys, quantized as one process does (the
        # tiny model's rank windows start on query-block boundaries): bit-identical too.
        if bitwise:
            assert res[f"rel_l1_cp_vs_single_{linear}"] == 0.0, res
        elif ring == 1:
            assert res[f"rel_l1_cp_vs_stock_{linear}"] <= 1.3 * err, res
            assert res[f"rel_l1_cp_vs_single_{linear}"] <= 1.0 * err, res
        else:
            assert res[f"rel_l1_cp_vs_stock_{linear}"] <= 1.6 * err, res
            assert res[f"rel_l1_cp_vs_single_{linear}"] <= 2.0 * err, res
    assert res["fp8_calls_cp1"] > 0 and res["fp8_calls_cp0"] == res["fp8_calls_cp1"], res
    assert res["rel_l1_single_vs_stock_fp8"] > res["rel_l1_single_vs_stock_None"]  # FP8 did run
    # sparse=: every self-attention sparse on one process; under Ulysses too (each rank ranks its heads' blocks
    # over all keys), and under Ring (one call of the rank's queries over the gathered keys, its window placed)
    assert res["stats_cp0_sparse"]["sparse_calls"] == layers and 0.3 < res["density_cp0"] < 0.9, res
    err = res["rel_l1_single_vs_stock_dense"]
    assert res["rel_l1_sparse_vs_dense"] > 0.3 * err, res  # it skipped blocks that carry weight
    assert res["stats_cp1_sparse"]["sparse_calls"] == layers, res
    assert 0.3 < res["density_cp1"] < 0.9, res  # (each rank records its own heads' or queries' calls)
    if bitwise:  # the same blocks as one process (Ring: the rank's rows of them, its query blocks aligned)
        sparse_as_single(res)
    else:
        assert res["rel_l1_cp_vs_stock_sparse"] <= 1.3 * res["rel_l1_single_vs_stock_sparse"], res


@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_hunyuanvideo_under_context_parallelism(tmp_path, seed, ulysses, ring):
    """`sagegen.patch` on HunyuanVideo under context parallelism (sagegen's plan and mask hooks; tiny model, 2 gloo
    processes): the fused joint prologue runs on every joint call and hands it to sagegen's CP with its
    (video, text) segments, so under Ulysses every rank attends in one process's token order (bit-identical to
    one process, sparse included, with the text keys kept); the single block's fused FP8 cat-GELU projection
    runs although the mask hooks were installed before the patch; unpatching restores the hooked blocks' stock
    forward. Under Ring: the same error as one process; sparse, the keys gathered in one process's order and the
    video and the text rows attending in a call each (text kept), equal to one process."""
    check_patched_hunyuan(cp_patched_support.run_patched_hunyuan(tmp_path, ulysses=ulysses, ring=ring, seed=seed),
                          ring)


@pytest.mark.parametrize("in_order", ["1", "0"])
def test_patched_hunyuanvideo_dense_ring_in_order_equals_one_process(tmp_path, seed, monkeypatch, in_order):
    """HunyuanVideo's dense joint calls under Ring 2 gather their keys in one process's order (the default) and
    attend in one call, so the patched output (FP8 linears included) equals one process bit for bit;
    SAGEGEN_RING_IN_ORDER=0 keeps the chunk order, another draw of the same error (so the check can fail: 140
    tokens, where the two orders put keys in other quantization blocks; at 44 they share one block)."""
    from sagegen.backend import attention as db

    monkeypatch.setenv(db.RING_IN_ORDER_ENV, in_order)  # the spawned ranks inherit it
    res = cp_patched_support.run_patched_hunyuan(tmp_path, ulysses=1, ring=2, seed=seed, dense_side=16)
    check_patched_hunyuan(res, 2)
    same = res["rel_l1_cp_vs_single_None"] == 0.0 and res["rel_l1_cp_vs_single_fp8"] == 0.0
    assert same == (in_order == "1"), {k: v for k, v in res.items() if k.startswith("rel_l1")}


def check_patched_hunyuan(res: dict, ring: int, bitwise: bool = True) -> None:
    """``bitwise``: as in `check_patched_wan`."""
    assert res["nan"] == 0 and res["unpatch_equal_under_cp"], res
    for variant in ("None", "fp8"):
        single, cp = res[f"stats_cp0_{variant}"], res[f"stats_cp1_{variant}"]
        assert single["fused_qk_prologue"] == 2 and "context_parallel" not in single, single  # dual + single block
        assert cp["fused_qk_prologue"] == 2 and cp["context_parallel"] == 2, cp
        assert not cp.get("unrouted_processor_calls") and not cp.get("fallback"), cp
        err = res[f"rel_l1_single_vs_stock_{variant}"]
        assert 0 < err < 0.1
        if ring == 1 and bitwise:  # Ulysses: every rank runs the one-process calls on its heads
            assert res[f"rel_l1_cp_vs_single_{variant}"] == 0.0, res
        elif ring == 1:
            assert res[f"rel_l1_cp_vs_stock_{variant}"] <= 1.3 * err, res
        else:  # Ring: each KV chunk quantized on its own, another draw of the same error
            assert res[f"rel_l1_cp_vs_stock_{variant}"] <= 1.6 * err, res
    assert res["cat_gelu_cp0"] == res["cat_gelu_cp1"] == 1, res  # the hooked single block is still fused
    assert res["fp8_calls_cp1"] == res["fp8_calls_cp0"] > 0, res
    err = res["rel_l1_single_vs_stock_sparse"]
    assert res["stats_cp0_sparse"]["sparse_calls"] == 2 and res["text_kept_cp0"] == [True, True], res
    assert 0.3 < res["density_cp0"] < 1.0
    calls = 2 * (1 if ring == 1 else 2)  # under Ring a joint call's video and text rows attend in a call each
    assert res["stats_cp1_sparse"]["sparse_calls"] == calls and res["text_kept_cp1"] == [True] * calls, res
    assert 0.3 < res["density_cp1"] < 1.0 and not res["stats_cp1_sparse"].get("sparse_dense_unordered"), res
    if bitwise:
        sparse_as_single(res)
    else:
        assert res["rel_l1_cp_vs_stock_sparse"] <= (1.3 if ring == 1 else 1.6) * err, res


@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_flux_under_context_parallelism(tmp_path, seed, ulysses, ring):
    """`sagegen.patch` on Flux under diffusers' own plan (tiny model, 2 gloo processes): the fused joint prologue
    (Q/K norms and rotary embeddings into [text, image] buffers) runs on the double and the single block and
    hands each call to sagegen's CP with its (text, image) lengths; under Ulysses the output equals one process
    bit for bit, under Ring it stays within sagegen's error of the stock model."""
    check_patched_flux(cp_patched_support.run_patched_flux(tmp_path, ulysses=ulysses, ring=ring, seed=seed), ring)


def check_patched_flux(res: dict, ring: int, bitwise: bool = True) -> None:
    """``bitwise``: as in `check_patched_wan`."""
    assert res["nan"] == 0
    assert res["stats_cp0"]["fused_qk_prologue"] == 2 and "context_parallel" not in res["stats_cp0"], res
    cp = res["stats_cp1"]
    assert cp["fused_qk_prologue"] == 2 and cp["context_parallel"] == 2 and not cp.get("fallback"), res
    err = res["rel_l1_single_vs_stock"]
    assert 0 < err < 0.1 and res["rel_l1_cp_vs_stock"] <= (1.3 if ring == 1 else 1.6) * err, res
    if ring == 1 and bitwise:  # the double and the single block attend in one process's token order
        assert res["rel_l1_cp_vs_single"] == 0.0, res


@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_hunyuanvideo15_sparse_under_context_parallelism(tmp_path, seed, ulysses, ring):
    """`sagegen.patch(..., sparse=)` on HunyuanVideo-1.5 under context parallelism (tiny model, 2 gloo processes):
    its main blocks run on the patch's backend route, whose calls carry their (video, text) segments, so under
    Ulysses each rank ranks the blocks in one process's order, with the text keys kept (bit-identical to one
    process); under Ring too, the keys gathered in that order and the video and text rows in a call each."""
    check_patched_hunyuan15(cp_route_support.run_patched_hunyuan15(tmp_path, ulysses=ulysses, ring=ring,
                                                                     seed=seed), ring)


def check_patched_hunyuan15(res: dict, ring: int, bitwise: bool = True) -> None:
    """``bitwise``: as in `check_patched_wan`."""
    assert res["nan"] == 0
    layers = res["layers"]
    for name in ("dense", "sparse"):
        assert not res[f"stats_cp1_{name}"].get("fallback"), res
    err = res["rel_l1_single_vs_stock_sparse"]
    assert res["stats_cp0_sparse"]["sparse_calls"] == layers and res["text_kept_cp0"] == [True] * layers, res
    assert 0.3 < res["density_cp0"] < 1.0 and res["rel_l1_sparse_vs_dense"] > 0.3 * err, res
    cp = res["stats_cp1_sparse"]
    calls = layers * (1 if ring == 1 else 2)  # under Ring a call's video and text rows attend in a call each
    assert cp["sparse_calls"] == calls and res["text_kept_cp1"] == [True] * calls, res
    assert 0.3 < res["density_cp1"] < 1.0 and not cp.get("sparse_dense_unordered"), res  # this rank's rows/heads
    if bitwise:
        sparse_as_single(res)
    else:
        assert res["rel_l1_cp_vs_stock_sparse"] <= (1.3 if ring == 1 else 1.6) * err, res


@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_ltx_sparse_under_context_parallelism(tmp_path, seed, ulysses, ring):
    """`sagegen.patch(..., sparse=)` on LTX-Video under diffusers' own plan (tiny model, 2 gloo processes): its
    fused Q/K prologue runs on each rank's tokens, and its self-attention is video only, so the split's keys come
    in one process's order. Ulysses: each rank runs the top-k policy on its heads, and the output equals one
    process bit for bit, dense and sparse. Ring: each rank attends once over the gathered keys with its queries
    as a window of them, and the output equals one process bit for bit, dense and sparse."""
    check_patched_ltx(cp_route_support.run_patched_ltx(tmp_path, ulysses=ulysses, ring=ring, seed=seed), ring)


def check_patched_ltx(res: dict, ring: int = 1, bitwise: bool = True) -> None:
    """``bitwise``: as in `check_patched_wan`."""
    layers = res["layers"]
    assert res["nan"] == 0
    for cp in (0, 1):
        stats = res[f"stats_cp{cp}_sparse"]
        assert stats["sparse_calls"] == layers and not stats.get("sparse_dense_unordered"), res
        assert 0.2 < res[f"density_cp{cp}"] < 0.8, res
    for cp in (0, 1):  # the fused Q/K prologue runs under the split too (self- and cross-attention)
        assert res[f"stats_cp{cp}_dense"]["fused_qk_prologue"] == 2 * layers, res
    assert res["stats_cp1_sparse"]["context_parallel"] == 2 * layers, res
    assert res["rel_l1_sparse_vs_dense"] > 0.3 * res["rel_l1_single_vs_stock_dense"], res
    if bitwise:  # Ring: one call over the gathered keys, dense or sparse
        assert res["rel_l1_cp_vs_single_dense"] == 0.0, res
        sparse_as_single(res)
    for name in ("dense", "sparse"):
        bound = 1.3 if ring == 1 else 1.6
        assert res[f"rel_l1_cp_vs_stock_{name}"] <= bound * res[f"rel_l1_single_vs_stock_{name}"], res


@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_qwenimage_under_context_parallelism(tmp_path, seed, ulysses, ring):
    """`sagegen.patch` on Qwen-Image under diffusers' own plan (tiny model, 2 gloo processes, text padding in
    rank 1's chunk): the fused joint prologue runs on each rank's tokens and hands the split its (text, image)
    segments, so under Ulysses the output equals one process bit for bit; under Ring it stays within sagegen's
    error of the stock model."""
    check_patched_qwen(cp_route_support.run_patched_qwen(tmp_path, ulysses=ulysses, ring=ring, seed=seed), ring)


def check_patched_qwen(res: dict, ring: int, bitwise: bool = True) -> None:
    """``bitwise``: as in `check_patched_wan`."""
    layers = res["layers"]
    assert res["nan"] == 0
    single = res["stats_cp0_dense"]
    assert single["fused_qk_prologue"] == layers and "context_parallel" not in single, res
    cp = res["stats_cp1_dense"]
    assert cp["fused_qk_prologue"] == layers and cp["context_parallel"] == layers and not cp.get("fallback"), res
    err = res["rel_l1_single_vs_stock_dense"]
    assert 0 < err < 0.1, res
    if ring == 1 and bitwise:
        assert res["rel_l1_cp_vs_single_dense"] == 0.0, res
    else:
        assert res["rel_l1_cp_vs_stock_dense"] <= (1.3 if ring == 1 else 1.6) * err, res


def test_parts_of_a_ring_call_take_their_whole_calls_route(monkeypatch):
    """A Ring joint call attended part by part (block-sparse) routes each part as the rank's whole call: with
    ``backend="auto"`` on a GPU, the text rows alone would go to PyTorch SDPA, where one process runs them in the
    kernel with the video rows; `part_backend` keeps them on the kernel, and the backend's local attention
    hands ``call_rows`` to it."""
    import types

    import torch

    import sagegen.parallel
    import sagegen.parallel.local as local_mod
    from sagegen.kernels.dispatch import auto_prefers_sdpa
    from sagegen.backend import attention as db

    def fake(rows, cuda=True):  # [B, S, H, D] shapes only: the rule reads no values
        return types.SimpleNamespace(is_cuda=cuda, shape=(1, rows, 24, 128))

    text, video, keys = fake(128), fake(59_528), fake(119_056)
    assert auto_prefers_sdpa(128, 119_056, 24, 128) and not auto_prefers_sdpa(59_528, 119_056, 24, 128)
    assert local_mod.part_backend("auto", text, keys, call_rows=59_528) == "triton"
    assert local_mod.part_backend("auto", text, keys, call_rows=None) == "auto"           # not a part
    assert local_mod.part_backend("auto", text, fake(256), call_rows=256) == "auto"       # the whole call is small
    assert local_mod.part_backend("reference", text, keys, call_rows=59_528) == "reference"
    assert local_mod.part_backend("auto", fake(128, cuda=False), keys, call_rows=59_528) == "auto"  # CPU
    assert video.shape[1] > text.shape[1]

    captured, asked, routed = {}, [], []
    monkeypatch.setattr(sagegen.parallel, "context_parallel_attention",
                        lambda *a, **kw: captured.update(kw) or a[0])

    def recording_part_backend(backend, q, k, call_rows):
        asked.append((backend, call_rows))
        return "triton"
    monkeypatch.setattr(local_mod, "part_backend", recording_part_backend)
    monkeypatch.setattr(db, "local_attention", lambda q, k, v, settings, **kw: routed.append(settings.backend))
    q = torch.zeros(1, 4, 2, 64)
    db._context_parallel(q, q, q, None, 0.0, False, None, False, False, object(), db.BackendSettings())
    captured["local_attention"](q, q, q, q_offset=0, call_rows=4)
    captured["local_attention"](q, q, q)
    assert asked == [("auto", 4)] and routed == ["triton", "auto"]
