"""Block masks for a query window (``q_offset``): one rank's queries of a self-attention under Ring, whose keys
are the whole sequence. The window's mask must be the whole call's mask restricted to its rows when the window
starts on a query-block boundary, and its rules (text rows, diagonal) must follow global positions otherwise.
The one-pass selection runs in the Triton interpreter on CPU."""

from __future__ import annotations

import pytest
import torch

import sagegen
from sagegen import SparseConfig
from sagegen.kernels.block_sparse import BlockSparse
from sagegen.sparse import patterns, predictor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qk(seed, b, h, n, d):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, 1, 1, d, generator=g)  # the shared component diffusion Q/K carry
    q = (torch.randn(b, h, n, d, generator=g) + 2 * shared).to(DEVICE, torch.bfloat16)
    k = (torch.randn(b, h, n, d, generator=g) + 2 * shared).to(DEVICE, torch.bfloat16)
    return q, k


PREDICTED = [  # (n, bq, bkv, cfg): text at either end, top-k and cdf
    (320, 16, 32, SparseConfig(mode="topk", value=0.3, text=(-40, 320))),
    (300, 32, 64, SparseConfig(mode="cdf", value=0.8, text=(0, 50), keep_first=False)),
    (256, 16, 16, SparseConfig(mode="topk", value=0.2)),
]


@pytest.mark.parametrize("case", range(len(PREDICTED)))
@pytest.mark.parametrize("window", [(0, 2), (1, 2), (2, 4)])  # (which window, how many)
def test_aligned_window_is_the_whole_calls_rows(seed, case, window):
    n, bq, bkv, cfg = PREDICTED[case]
    q, k = _qk(seed, 2, 3, n, 32)
    part, parts = window
    span = -(-n // (parts * bq)) * bq  # a whole number of query blocks
    off = part * span
    qw = q[:, :, off:off + span]
    rows = slice(off // bq, off // bq + -(-qw.shape[2] // bq))
    kw = dict(sm_scale=32 ** -0.5, block_q=bq, block_kv=bkv)
    full = predictor.predict_keep(q, k, cfg, **kw)
    # the torch oracle and the one-pass selection, with the window's own pooled Q
    ref_keep = predictor.predict_keep(qw, k, cfg, q_offset=off, **kw)
    assert torch.equal(ref_keep, full[:, :, rows])
    counts, indices = predictor.predict_compact(qw, k, cfg, q_offset=off, **kw)
    ref = BlockSparse.from_block_dense(ref_keep, bq, bkv)
    assert torch.equal(counts, ref.counts) and torch.equal(indices, ref.indices)
    # without the offset the rows' rules would sit at the wrong positions (this test can fail)
    if off and (cfg.text is not None or cfg.keep_diagonal):
        assert not torch.equal(predictor.predict_keep(qw, k, cfg, **kw), full[:, :, rows])


@pytest.mark.parametrize("mode", ["sta", "radial"])
@pytest.mark.parametrize("order", ["video_text", "text_video"])
def test_aligned_window_of_a_static_pattern(mode, order):
    grid, text = (4, 8, 16), 64
    n = grid[0] * grid[1] * grid[2] + text
    cfg = SparseConfig(mode=mode, grid=grid, window=(1, 2, 8), decay=1, token_order=order)
    full = patterns.static_keep(cfg, n, n, 64, 64, "cpu")[0, 0]
    for off, span in ((0, 192), (192, 192), (384, 192)):
        w = patterns.static_keep(cfg, span, n, 64, 64, "cpu", q_offset=off)[0, 0]
        assert torch.equal(w, full[off // 64:(off + span) // 64]), (off, order)
    assert not torch.equal(patterns.static_keep(cfg, 192, n, 64, 64, "cpu")[0, 0], full[3:6])


def test_unaligned_window_rules_follow_global_positions(seed):
    n, bq, bkv, off, span = 400, 16, 32, 37, 150
    text = (330, 400)
    cfg = SparseConfig(mode="topk", value=0.1, text=text, keep_first=False)
    q, k = _qk(seed, 1, 2, n, 32)
    qw = q[:, :, off:off + span]
    kw = dict(sm_scale=32 ** -0.5, block_q=bq, block_kv=bkv, q_offset=off)
    keep = predictor.predict_keep(qw, k, cfg, **kw)
    counts, indices = predictor.predict_compact(qw, k, cfg, **kw)
    ref = BlockSparse.from_block_dense(keep, bq, bkv)
    assert torch.equal(counts, ref.counts) and torch.equal(indices, ref.indices)
    keep = keep[0, 0].cpu()
    text_keys = torch.zeros(keep.shape[1], dtype=torch.bool)
    text_keys[text[0] // bkv:] = True
    for i in range(keep.shape[0]):
        tokens = range(off + i * bq, min(off + (i + 1) * bq, off + span))  # the block's global positions
        if any(text[0] <= t < text[1] for t in tokens):
            assert keep[i].all(), i  # a text row: every key block
        own = {t // bkv for t in tokens}
        assert all(keep[i, j] for j in own), i  # the diagonal: the key blocks of its own tokens
        assert keep[i, text_keys].all()  # text keys for every query


def test_window_through_sparse_block_mask_and_its_errors():
    q, k = (torch.randn(1, 2, 256, 32, dtype=torch.bfloat16) for _ in range(2))
    cfg = SparseConfig(mode="topk", value=0.25)
    args = dict(tensor_layout="HND", attn_mask=None, sm_scale=0.17, config=sagegen.SageConfig())
    full = sagegen.sparse.sparse_block_mask(q, k, cfg, **args)
    bs = sagegen.sparse.sparse_block_mask(q[:, :, 128:], k, cfg, q_offset=128, **args)
    rows = full.block_q and slice(128 // full.block_q, None)
    assert torch.equal(bs.counts, full.counts[:, :, rows]) and torch.equal(bs.indices, full.indices[:, :, rows])
    nhd = sagegen.sparse.sparse_block_mask(q[:, :, 128:].transpose(1, 2), k.transpose(1, 2), cfg, q_offset=128,
                                           **{**args, "tensor_layout": "NHD"})
    assert torch.equal(nhd.counts, bs.counts)
    for bad in (-1, 129):
        with pytest.raises(ValueError, match="q_offset"):
            sagegen.sparse.sparse_block_mask(q[:, :, 128:], k, cfg, q_offset=bad, **args)
