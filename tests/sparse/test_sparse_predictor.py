"""The block-mask predictor, static patterns and `sageattn(sparse=...)` on CPU (emulation / Triton interpreter).

Evidence on synthetic video-like inputs (sagegen.testing.attention_inputs: attention decays with grid distance): the
predicted mask keeps >= 99% of the attention mass and the sparse output's error against fp64 dense attention
stays within 2x the dense quantized call's own error.
"""

from __future__ import annotations

import math

import pytest
import torch

import sagegen
from sagegen import SparseConfig
from sagegen.kernels.block_sparse import BlockSparse
from sagegen.kernels.reference import attention_fp64
from sagegen.sparse import patterns, pool, predictor
from sagegen.testing import attention_inputs as synthetic
from sagegen.sparse.sparse_config import parse_spec
from sagegen.sparse.text import SparseArgError, parse_sparse_arg


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("n,d,block", [(300, 64, 64), (257, 96, 128), (128, 32, 64)])
def test_pool_triton_matches_torch(seed, n, d, block):
    x = (torch.randn(2, 3, n, d) + 3 * torch.randn(1, 1, 1, d)).to(torch.bfloat16)
    x = x.transpose(1, 2).contiguous().transpose(1, 2)  # a strided (NHD-backed) view
    c = pool.center(x)
    m1, s1 = pool.pool_blocks(x, block, c)
    m2, s2 = pool.pool_blocks_torch(x, block, c)
    assert m1.shape == (2, 3, -(-n // block), d) and s1.shape == (2, 3, -(-n // block))
    torch.testing.assert_close(m1, m2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)


def test_self_similarity_tells_coherent_from_scattered_blocks(seed):
    d, block = 64, 64
    coherent = torch.randn(1, 1, 1, d) + 0.05 * torch.randn(1, 1, block, d)
    scattered = torch.randn(1, 1, block, d)
    _, sim = pool.pool_blocks_torch(torch.cat([coherent, scattered], dim=2), block,
                                    c=torch.zeros(1, 1, d))
    assert sim[0, 0, 0] > 0.95 and sim[0, 0, 1] < 0.3


def test_select_topk_and_cdf():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert predictor.select(p, "topk", 0.5).tolist() == [[True, True, False, False]]
    assert predictor.select(p, "cdf", 0.8).tolist() == [[True, True, False, False]]
    assert predictor.select(p, "cdf", 0.81).tolist() == [[True, True, True, False]]
    assert predictor.select(p, "cdf", 1.0).tolist() == [[True, True, True, True]]


def test_always_keep_rules(seed):
    q, k = torch.randn(1, 2, 640, 64), torch.randn(1, 1, 640, 64)  # GQA: 2 query heads on 1 kv head
    cfg = SparseConfig(mode="topk", value=0.2, text=(-100, 640), keep_first=True)
    keep = predictor.predict_keep(q, k, cfg, sm_scale=0.125, block_q=64, block_kv=128)
    assert keep.shape == (1, 2, 10, 5)
    assert keep[..., 0].all()  # first key block
    assert keep[..., 4].all()  # the text keys' block
    assert keep[:, :, 8:].all()  # text queries (rows 540..639) dense
    diag = torch.arange(10) * 64 // 128
    assert keep[0, 0, torch.arange(10), diag].all()  # own block
    # the judge: a threshold above every similarity makes everything dense
    dense = predictor.predict_keep(q, k, cfg.replace(sim_threshold=1.0), sm_scale=0.125, block_q=64, block_kv=128)
    assert dense.all()


def test_key_padding_drops_dead_blocks(seed):
    q, k = torch.randn(2, 1, 512, 64), torch.randn(2, 1, 512, 64)
    bias = torch.zeros(2, 512)
    bias[1, 256:] = -math.inf
    keep = predictor.predict_keep(q, k, SparseConfig(value=1.0), sm_scale=0.125, block_q=64, block_kv=128,
                                  key_bias=bias)
    assert keep[0].all() and keep[1, ..., :2].all() and not keep[1, ..., 2:].any()


@pytest.mark.parametrize("mode,value", [("topk", 0.5), ("cdf", 0.99)])
def test_predictor_keeps_the_attention_mass_on_video_like_inputs(mode, value):
    g = torch.Generator().manual_seed(1234)
    q, k, v = synthetic.video_qkv(16, 8, 16, heads=2, head_dim=64, generator=g)
    scale = 1 / 8
    cfg = SparseConfig(mode=mode, value=value)
    keep = predictor.predict_keep(q, k, cfg, sm_scale=scale, block_q=64, block_kv=128)
    density = keep.float().mean().item()
    assert density < 0.6  # the mask does skip blocks
    mass = synthetic.kept_mass(synthetic.attention_probs(q, k, scale), keep, 64, 128)
    assert mass.mean() >= 0.99 and mass.min() >= 0.95, (density, mass.mean(), mass.min())
    # output error against fp64 dense: within 2x the dense quantized call's own error
    ref, _ = attention_fp64(q, k, v, sm_scale=scale)
    dense = sagegen.sageattn(q, k, v, backend="reference")
    sparse = sagegen.sageattn(q, k, v, backend="reference", sparse=cfg)
    assert _rel(sparse, ref) <= 2 * _rel(dense, ref), (_rel(sparse, ref), _rel(dense, ref))


def test_sparse_call_equals_its_block_mask_and_the_dense_mask(seed):
    q, k, v = (torch.randn(1, 2, 400, 64, dtype=torch.bfloat16) for _ in range(3))
    cfg = SparseConfig(mode="topk", value=0.4)
    bs = sagegen.sparse.sparse_block_mask(q, k, cfg, tensor_layout="HND", attn_mask=None, sm_scale=0.125,
                                          config=sagegen.SageConfig())
    assert isinstance(bs, BlockSparse) and bs.counts.dtype == torch.int32
    a = sagegen.sageattn(q, k, v, sparse=cfg, backend="reference")
    b = sagegen.sageattn(q, k, v, block_mask=bs, backend="reference")
    c = sagegen.sageattn(q, k, v, attn_mask=bs.to_dense_mask(400, 400), backend="reference")
    assert torch.equal(a, b)
    torch.testing.assert_close(a, c, atol=2e-3, rtol=1e-2)  # skipped blocks vs -inf blocks: fp32 order
    # the Triton kernel (interpreter) with the predicted mask agrees with the emulation
    t = sagegen.sageattn(q, k, v, sparse=cfg, backend="triton")
    assert _rel(t, a) < 2e-2


def test_sparse_nhd_layout_and_compile(seed):
    q, k, v = (torch.randn(1, 300, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    cfg = SparseConfig(mode="cdf", value=0.9)
    eager = sagegen.sageattn(q, k, v, tensor_layout="NHD", sparse=cfg, backend="reference")
    hnd = sagegen.sageattn(*(t.transpose(1, 2) for t in (q, k, v)), sparse=cfg, backend="reference")
    assert torch.equal(eager, hnd.transpose(1, 2))
    fn = torch.compile(lambda a, b, c: sagegen.sageattn(a, b, c, tensor_layout="NHD", sparse=cfg,
                                                        backend="reference"), fullgraph=True)
    assert torch.equal(fn(q, k, v), eager)


def test_sparse_argument_errors():
    q = torch.randn(1, 1, 128, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="sparse must be a sagegen.SparseConfig"):
        sagegen.sageattn(q, q, q, sparse="topk=0.5")
    bs = BlockSparse.from_block_dense(torch.ones(1, 1, 2, 1, dtype=torch.bool), 64, 128)
    with pytest.raises(ValueError, match="not both"):
        sagegen.sageattn(q, q, q, sparse=SparseConfig(), block_mask=bs)
    with pytest.raises(ValueError, match="needs grid"):
        sagegen.sageattn(q, q, q, sparse=SparseConfig(mode="sta"))
    with pytest.raises(ValueError, match="mode"):
        SparseConfig(mode="dense")
    with pytest.raises(ValueError, match="value"):
        SparseConfig(value=0.0)


def test_spec_round_trip():
    for cfg in (SparseConfig(), SparseConfig(mode="cdf", value=0.93, sim_threshold=0.2, text=(0, 226)),
                SparseConfig(mode="radial", grid=(4, 6, 8), token_order="text_video", window=(0, 4, 4), decay=3)):
        back = parse_spec(cfg.to_spec())
        for f in ("mode", "value", "sim_threshold", "text", "keep_first", "keep_diagonal"):
            assert getattr(back, f) == getattr(cfg, f)
        if cfg.grid:
            assert (back.grid, back.window, back.decay, back.token_order) == (cfg.grid, cfg.window, cfg.decay,
                                                                              cfg.token_order)


@pytest.mark.parametrize("text,check", [
    ("topk=0.5", dict(mode="topk", value=0.5)),
    ("cdf=0.9,sim=0.2,steps=0.3,blocks=0+1", dict(mode="cdf", value=0.9, sim_threshold=0.2, dense_steps=0.3,
                                                   dense_blocks=(0, 1))),
    ("sta:window=1x6x6", dict(mode="sta", window=(1, 6, 6))),
    ("radial,decay=3,blocks=none", dict(mode="radial", decay=3, dense_blocks=())),
])
def test_parse_sparse_arg(text, check):
    cfg = parse_sparse_arg(text)
    for k, v in check.items():
        assert getattr(cfg, k) == v


@pytest.mark.parametrize("text,match", [("top=0.5", "start with"), ("topk", "needs a value"),
                                        ("topk=2", "value"), ("sta:window=3x3", "FxHxW"),
                                        ("cdf=0.9,bogus=1", "unknown"), ("calib=/nonexistent.json", "no such file")])
def test_parse_sparse_arg_errors(text, match):
    with pytest.raises(SparseArgError, match=match):
        parse_sparse_arg(text)


def test_sta_pattern_is_a_window_on_the_grid():
    cfg = SparseConfig(mode="sta", grid=(8, 4, 16), window=(1, 8, 16), keep_first=False, keep_diagonal=False)
    keep = patterns.static_keep(cfg, 512, 512, 64, 64, "cpu")[0, 0]  # one block = one frame
    f = torch.arange(8)
    assert torch.equal(keep, (f[:, None] - f[None, :]).abs() <= 1)


def test_radial_pattern_shrinks_with_time_and_keeps_text_and_sink():
    grid = (8, 8, 16)  # a frame = 128 tokens = 2 blocks of 64 (rows 0-3, rows 4-7)
    cfg = SparseConfig(mode="radial", grid=grid, window=(0, 4, 16), decay=2, text=None, token_order="text_video")
    n = 64 + 8 * 8 * 16  # one block of text first
    keep = patterns.static_keep(cfg, n, n, 64, 64, "cpu")[0, 0]
    assert keep[0].all() and keep[:, 0].all()  # text rows / columns (and the sink)
    # query block 1 (frame 0, rows 0-3): frame 1 both halves (gap 0 in time, 1 in rows <= 4)...
    assert keep[1, 3] and keep[1, 4]
    # ...at a time gap of 6 frames the window is 4 / 2^3 = 0.5 rows: only the touching half (row gap 0)
    assert keep[1, 13] and not keep[1, 14]
    # the text range comes from the grid when not given
    assert patterns.text_range(cfg, n) == (0, 64)


def test_static_mask_through_sageattn_and_flex(seed):
    cfg = SparseConfig(mode="sta", grid=(4, 8, 16), window=(1, 2, 16))
    q, k, v = (torch.randn(1, 2, 512, 64, dtype=torch.bfloat16) for _ in range(3))
    bs = sagegen.sparse.sparse_block_mask(q, k, cfg, tensor_layout="HND", attn_mask=None, sm_scale=0.125,
                                          config=sagegen.SageConfig())
    assert bs.counts.shape == (1, 1, 8)  # broadcast over batch and heads
    out = sagegen.sageattn(q, k, v, sparse=cfg, backend="reference")
    dense = sagegen.sageattn(q, k, v, attn_mask=bs.to_dense_mask(512, 512), backend="reference")
    torch.testing.assert_close(out, dense, atol=2e-3, rtol=1e-2)  # skipped vs -inf blocks: fp32 order
    flex = patterns.to_flex(cfg, 512, 512, block=128)
    back = BlockSparse.from_flex_block_mask(flex)
    assert torch.equal(back.to_dense_mask(512, 512),
                       patterns.static_keep(cfg, 512, 512, 128, 128, "cpu").repeat_interleave(128, 2)
                       .repeat_interleave(128, 3))

