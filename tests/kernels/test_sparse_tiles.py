"""The block mask -> kernel tile lists conversion (`kernels.triton_sparse_tiles`, under the interpreter on CPU)
against the PyTorch form through the dense tile matrix, on valid and on bad data (both must drop the same
entries, so that the kernels and the emulation run the same mask)."""

import pytest
import torch

from sagegen import BlockSparse
from sagegen.kernels import triton_sparse_tiles
from sagegen.kernels.block_sparse import kernel_tiles_dense

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the interpreter (conftest.py)


def assert_same(bs, tile_q, tile_k, n_q, n_k, key_lengths=None):
    bs = bs.to(DEVICE)
    key_lengths = key_lengths.to(DEVICE) if key_lengths is not None else None
    c, i = triton_sparse_tiles.convert(bs.counts, bs.indices, bs.block_q, bs.block_kv, tile_q, tile_k, n_q, n_k,
                                       key_lengths)
    cd, idd = kernel_tiles_dense(bs, tile_q, tile_k, n_q, n_k, key_lengths)
    assert c.shape == cd.shape and i.shape == idd.shape
    assert torch.equal(c, cd)
    assert torch.equal(i, idd)  # the listed tiles, then zeros
    return c.cpu(), i.cpu()


@pytest.mark.parametrize("block_q,block_kv,n_q,n_k", [(64, 128, 200, 333), (128, 128, 300, 1000),
                                                      (192, 384, 250, 900), (128, 256, 64, 129)])
def test_valid_masks_match_dense_form(seed, block_q, block_kv, n_q, n_k):
    nqb, nkb = -(-n_q // block_q), -(-n_k // block_kv)
    for b, h in ((2, 3), (1, 3), (2, 1)):
        blocks = torch.rand(b, h, nqb, nkb) < 0.5
        blocks[0, 0, -1] = False  # an empty row
        bs = BlockSparse.from_block_dense(blocks, block_q, block_kv)
        assert_same(bs, 64, 128, n_q, n_k)
        lengths = torch.randint(1, n_k + 1, (2,), dtype=torch.int32)
        c, i = assert_same(bs, 64, 128, n_q, n_k, lengths)
        assert c.shape[0] == 2 and (c.cpu() <= ((lengths + 127) // 128)[:, None, None]).all()


def test_bad_data_dropped_as_the_emulation_does(seed):
    nkb = 6
    idx = torch.tensor([[3, 3, 5, 0, 7, 4],     # a repeat, a smaller one, out of range, then 4 < 5
                        [-1, 2, 1, 4, 9, 5],    # negative first, then 2, 1 dropped, 4, 9 out, 5
                        [5, 4, 3, 2, 1, 0],     # descending: only the first
                        [0, 1, 2, 3, 4, 5]], dtype=torch.int32)  # valid, count 4 below
    counts = torch.tensor([6, 6, 6, 4], dtype=torch.int32)
    bs = BlockSparse(counts.view(1, 1, 4), idx.view(1, 1, 4, nkb), 64, 128)
    c, i = assert_same(bs, 64, 128, 4 * 64, nkb * 128)
    assert c.flatten().tolist() == [2, 3, 1, 4]
    assert i[0, 0, 0, :2].tolist() == [3, 5] and i[0, 0, 1, :3].tolist() == [2, 4, 5]
    assert bs.to_block_dense()[0, 0, 0].nonzero().flatten().tolist() == [3, 5]  # the emulation's form
    # random garbage, with block multiples: still the same as the dense form
    bs = BlockSparse(torch.randint(-1, 9, (2, 2, 3), dtype=torch.int32),
                     torch.randint(-2, 9, (2, 2, 3, 7), dtype=torch.int32), 128, 256)
    assert_same(bs, 64, 128, 3 * 128 - 5, 7 * 256 - 100, torch.tensor([700, 1], dtype=torch.int32))


def test_mutation_of_the_rule_would_fail():
    """A mask whose every entry is valid keeps every tile (a test that an over-eager drop rule would fail)."""
    blocks = torch.ones(1, 2, 3, 5, dtype=torch.bool)
    bs = BlockSparse.from_block_dense(blocks, 64, 256)
    c, i = assert_same(bs, 64, 128, 3 * 64, 5 * 256 - 128)  # the last block's second tile is past the keys
    assert c.flatten().tolist() == [9] * 6 and i[0, 0, 0].tolist() == list(range(9))
