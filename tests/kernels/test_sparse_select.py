"""The predictor's one-pass selection (`kernels.triton_block_select` via `predictor.predict_compact`) against
the PyTorch predictor (`predict_keep` + `BlockSparse.from_block_dense`, the oracle), in the Triton interpreter:
top-k and cdf, every always-keep rule, GQA, key padding, ragged blocks, Nq != Nk, and fully masked rows."""

from __future__ import annotations

import math

import pytest
import torch

from sagegen import SparseConfig
from sagegen.kernels.block_sparse import BlockSparse
from sagegen.kernels.triton_block_select import select_blocks
from sagegen.sparse import predictor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the Triton kernel runs in the interpreter


def _oracle(q, k, cfg, bq, bkv, key_bias):
    keep = predictor.predict_keep(q, k, cfg, sm_scale=q.shape[-1] ** -0.5, block_q=bq, block_kv=bkv,
                                  key_bias=key_bias)
    bs = BlockSparse.from_block_dense(keep, bq, bkv)
    return bs.counts, bs.indices


CASES = [  # (B, Hq, Hkv, Nq, Nk, D, bq, bkv, cfg, key padding)
    (2, 3, 3, 300, 300, 64, 32, 64, SparseConfig(mode="topk", value=0.5), None),
    (1, 4, 2, 257, 257, 32, 16, 32, SparseConfig(mode="topk", value=0.3, text=(-40, 257), sim_threshold=0.4), None),
    (2, 2, 2, 200, 200, 64, 32, 32, SparseConfig(mode="cdf", value=0.9), "pad"),
    (1, 2, 1, 96, 250, 32, 32, 16, SparseConfig(mode="topk", value=0.25, keep_first=False), "pad"),
    (1, 2, 2, 128, 128, 32, 32, 32, SparseConfig(mode="cdf", value=0.5, text=(0, 20)), "all"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_one_pass_selection_equals_the_pytorch_predictor(seed, case):
    B, Hq, Hkv, nq, nk, d, bq, bkv, cfg, padding = CASES[case]
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, 1, 1, d, generator=g)  # a shared component, as diffusion Q/K carry
    q = (torch.randn(B, Hq, nq, d, generator=g) + 2 * shared).to(DEVICE, torch.bfloat16)
    k = (torch.randn(B, Hkv, nk, d, generator=g) + 2 * shared).to(DEVICE, torch.bfloat16)
    key_bias = None
    if padding == "pad":  # batch 0 loses its last 70 keys (whole key blocks die), the rest keep all
        key_bias = torch.zeros(B, nk)
        key_bias[0, -70:] = -math.inf
    elif padding == "all":  # every key of batch 0 masked: empty rows
        key_bias = torch.full((B, nk), -math.inf)
    key_bias = key_bias.to(DEVICE) if key_bias is not None else None
    counts, indices = predictor.predict_compact(q, k, cfg, sm_scale=d ** -0.5, block_q=bq, block_kv=bkv,
                                                key_bias=key_bias)
    ref_counts, ref_indices = _oracle(q, k, cfg, bq, bkv, key_bias)
    assert counts.shape == ref_counts.shape and indices.shape == ref_indices.shape
    assert torch.equal(counts, ref_counts), (counts - ref_counts).abs().max()
    assert torch.equal(indices, ref_indices)
    if padding == "all":
        assert int(counts.max()) == 0 and int(indices.abs().max()) == 0


def test_select_blocks_topk_threshold_and_validation():
    scores = torch.tensor([[[[0.1, 5.0, -1.0, 3.0, 4.0, 0.0]]]], device=DEVICE)
    live = torch.tensor([[64.0, 64.0, 64.0, 64.0, 0.0, 64.0]], device=DEVICE)  # block 4: no live key, never kept
    zeros = lambda n: torch.zeros(n, dtype=torch.int8, device=DEVICE)
    counts, idx = select_blocks(scores, live, mode="topk", value=0.5, scale=1.0, rows_always=zeros(1),
                                cols_always=zeros(6), keep_diagonal=False, block_q=64, block_kv=64)
    assert counts.tolist() == [[[3]]] and idx.tolist() == [[[[0, 1, 3, 0, 0, 0]]]]  # k = 3: 5, 3, 0.1
    first = torch.tensor([0, 0, 1, 0, 1, 0], dtype=torch.int8, device=DEVICE)  # a rule cannot revive the dead block 4
    counts, idx = select_blocks(scores, live, mode="topk", value=0.5, scale=1.0, rows_always=zeros(1),
                                cols_always=first, keep_diagonal=False, block_q=64, block_kv=64)
    assert counts.tolist() == [[[4]]] and idx[0, 0, 0].tolist() == [0, 1, 2, 3, 0, 0]
    with pytest.raises(ValueError, match="mode"):
        select_blocks(scores, live, mode="sta", value=0.5, scale=1.0, rows_always=zeros(1),
                      cols_always=zeros(6), keep_diagonal=False, block_q=64, block_kv=64)
    with pytest.raises(ValueError, match="scores"):
        select_blocks(scores.double(), live, mode="topk", value=0.5, scale=1.0, rows_always=zeros(1),
                      cols_always=zeros(6), keep_diagonal=False, block_q=64, block_kv=64)
