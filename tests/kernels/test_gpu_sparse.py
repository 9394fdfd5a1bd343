"""Block-sparse attention on the GPU at real sizes, both kernels (Gluon on Hopper, the portable Triton one):
against the emulation, against float64 with the equivalent dense mask, and against FlexAttention.
Skipped without CUDA; the interpreter twins are in test_sparse_kernel.py."""

import pytest
import torch

import sagegen
from tests.conftest import gpu
from tests.support.helpers import qkv, rel_l1, to_hnd
from sagegen import BlockSparse, SageConfig
from sagegen.kernels.reference import attention_fp64
from sagegen.kernels.spec import MaskSpec

pytestmark = gpu


@pytest.fixture(params=["gluon", "triton"])
def kernel(request, monkeypatch):
    """Force one kernel (SAGEGEN_KERNEL=gluon raises where the Gluon kernel does not apply: no silent fallback)."""
    if request.param == "gluon" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel is sm90-only")
    monkeypatch.setenv("SAGEGEN_KERNEL", request.param)
    return request.param


def blocks(b, h, nqb, nkb, density, empty=True):
    x = torch.rand(b, h, nqb, nkb, device="cuda") < density
    x |= torch.eye(nqb, nkb, dtype=torch.bool, device="cuda")  # most rows keep something
    if empty:
        x[0, 0, 1] = False
        x[-1, -1, nqb - 1] = False
    return x


def check_empty(out, lse, bs, n_q, layout="HND"):
    empty = (~bs.to_block_dense().any(-1)).repeat_interleave(bs.block_q, dim=2)[:, :, :n_q]
    o = to_hnd(out, layout)
    empty = empty.expand(o.shape[0], o.shape[1], n_q)
    assert empty.any() and (o[empty] == 0).all() and torch.isneginf(lse[empty]).all()


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("d", [64, 128])
def test_sparse_kernel_tracks_emulation_and_fp64(seed, kernel, layout, d):
    n_q, n_k = 4096 + 37, 4096 + 300
    q, k, v = qkv(2, 8, 4, n_q, n_k, d, dtype=torch.bfloat16, device="cuda", layout=layout)
    bs = BlockSparse.from_block_dense(blocks(2, 8, -(-n_q // 128), -(-n_k // 128), 0.3), 128, 128).validate()
    kw = dict(tensor_layout=layout, block_mask=bs, return_lse=True, config=sagegen.DIFFUSION_CONFIG)
    t, lt = sagegen.sageattn(q, k, v, backend="triton", **kw)
    r, lr = sagegen.sageattn(q, k, v, backend="reference", **kw)
    assert rel_l1(t, r) < 4e-3
    assert torch.equal(torch.isinf(lt), torch.isinf(lr))
    fin = torch.isfinite(lr)
    assert (lt[fin] - lr[fin]).abs().max() < 2e-3
    check_empty(t, lt, bs, n_q, layout)
    qh, kh, vh = (to_hnd(x, layout) for x in (q, k, v))
    ref, lse64 = attention_fp64(qh[:, :4], kh[:, :2], vh[:, :2], sm_scale=d**-0.5,
                                mask=MaskSpec("bool", bs.to_dense_mask(n_q, n_k)[:, :4]))
    # the quantization's usual error (the emulation's own, ~0.035 rel-L1 for N(0,1) inputs), not more
    err_kernel, err_emu = rel_l1(to_hnd(t, layout)[:, :4], ref), rel_l1(to_hnd(r, layout)[:, :4], ref)
    assert err_kernel < 0.05 and err_kernel < 1.1 * err_emu + 1e-3
    assert (lt[:, :4][fin[:, :4]] - lse64[fin[:, :4]]).abs().max() < 0.05


def test_sparse_with_key_padding_prefix_and_general_mask(seed, kernel):
    """A valid-prefix key mask (the Gluon kernel's key lengths: tiles past them are dropped) and, on the
    Triton kernel, a non-prefix key mask and a causal mask."""
    n = 6000
    q, k, v = qkv(2, 4, 4, n, n, 128, dtype=torch.bfloat16, device="cuda")
    keep = torch.ones(2, 1, 1, n, dtype=torch.bool, device="cuda")
    keep[0, ..., 2500:] = False  # batch 0: key tiles past 2500 are dropped; rows listing only them are empty
    bs = BlockSparse.from_block_dense(blocks(1, 4, -(-n // 128), -(-n // 128), 0.4), 128, 128)
    cases = [dict(attn_mask=keep)]
    if kernel == "triton":
        cases += [dict(attn_mask=torch.rand(2, 1, 1, n, device="cuda") > 0.3), dict(is_causal=True)]
    for kw in cases:
        t, lt = sagegen.sageattn(q, k, v, backend="triton", block_mask=bs, return_lse=True, **kw)
        r, lr = sagegen.sageattn(q, k, v, backend="reference", block_mask=bs, return_lse=True, **kw)
        assert torch.isfinite(t).all() and rel_l1(t, r) < 4e-3
        assert torch.equal(torch.isinf(lt), torch.isinf(lr))


def test_density_one_equals_dense(seed, kernel):
    """Every block listed: the same computation as the dense call (same tiles, same order)."""
    q, k, v = qkv(1, 8, 8, 5000, 5000, 128, dtype=torch.bfloat16, device="cuda")
    bs = BlockSparse.from_block_dense(torch.ones(1, 1, 40, 40, dtype=torch.bool, device="cuda"), 128, 128)
    t = sagegen.sageattn(q, k, v, backend="triton", block_mask=bs)
    dense = sagegen.sageattn(q, k, v, backend="triton")
    assert rel_l1(t, dense) < 1e-3


def test_against_flex_attention_with_the_same_block_mask(seed):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n, d = 4096, 128
    q, k, v = qkv(1, 8, 8, n, n, d, dtype=torch.bfloat16, device="cuda")

    def window(b, h, qi, ki):  # a block-aligned local window, wider for odd heads
        return (qi // 128 - ki // 128).abs() <= 2 + 2 * (h % 2)

    bm = create_block_mask(window, None, 8, n, n, device="cuda")
    t = sagegen.sageattn(q, k, v, backend="triton", block_mask=bm)
    flex = flex_attention(q, k, v, block_mask=bm)
    ref, _ = attention_fp64(q, k, v, sm_scale=d**-0.5,
                            mask=MaskSpec("bool", BlockSparse.from_flex_block_mask(bm).to_dense_mask(n, n)))
    print(f"rel-L1 vs fp64: sagegen {rel_l1(t, ref):.4f}, flex bf16 {rel_l1(flex, ref):.4f}")
    assert rel_l1(t, ref) < 0.04 and rel_l1(flex, ref) < 0.01


def test_compiled_fullgraph_with_block_sparse(seed):
    q, k, v = qkv(1, 8, 8, 3000, 3000, 64, dtype=torch.bfloat16, device="cuda", layout="NHD")
    bs = BlockSparse.from_block_dense(blocks(1, 8, 24, 24, 0.5, empty=False), 128, 128)

    def f(q, k, v, bs):
        return sagegen.sageattn(q * 1.0, k, v, tensor_layout="NHD", backend="triton", block_mask=bs) + 1

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(q, k, v, bs), f(q, k, v, bs))


def test_wrong_block_size_on_this_gpu(seed):
    q, k, v = qkv(1, 2, 2, 1000, 1000, 64, dtype=torch.bfloat16, device="cuda")
    bq, bk = SageConfig().blocks(64, torch.cuda.get_device_capability())
    odd = BlockSparse.from_block_dense(torch.ones(1, 1, -(-1000 // 32), -(-1000 // 32), dtype=torch.bool,
                                                  device="cuda"), 32, 32)
    with pytest.raises(ValueError, match=f"kernel's {bq} x {bk} tiles"):
        sagegen.sageattn(q, k, v, backend="triton", block_mask=odd)


def test_tile_conversion_matches_dense_form_at_real_size(seed):
    """The one-launch tile lists (triton_sparse_tiles) equal the PyTorch form at a 32k-token mask, with bad
    entries in it and with key lengths (the interpreter twin is tests/kernels/test_sparse_tiles.py)."""
    from sagegen.kernels.block_sparse import kernel_tiles, kernel_tiles_dense

    n = 32768 - 77
    nb = -(-n // 128)
    bs = BlockSparse.from_block_dense(blocks(2, 24, nb, nb, 0.3), 128, 128)
    bad = bs._replace(indices=bs.indices.masked_fill(torch.rand(bs.indices.shape, device="cuda") < 0.01, nb + 3))
    lengths = torch.tensor([n, n - 1000], dtype=torch.int32, device="cuda")
    for mask in (bs, bad):
        for kl in (None, lengths):
            got, want = kernel_tiles(mask, 64, 128, n, n, kl), kernel_tiles_dense(mask, 64, 128, n, n, kl)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("d", [64, 128])
def test_tile_list_in_shared_memory_changes_no_bit(seed, monkeypatch, d):
    """The Gluon kernel's key-tile list staged in shared memory (gluon_attn.list_in_smem) against the same list
    read from global memory in the loop: identical output and LSE, with GQA, both layouts, empty q-tiles, a
    ragged last tile and key lengths; a list longer than LIST_LIMIT takes the global path."""
    from sagegen.kernels import gluon_attn

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel is sm90-only")
    monkeypatch.setenv("SAGEGEN_KERNEL", "gluon")
    n_q, n_k = 3000 + 37, 6000 + 45
    keep = torch.ones(2, 1, 1, n_k, dtype=torch.bool, device="cuda")
    keep[1, ..., 4000:] = False  # a key-length prefix: tiles past it are dropped from the lists
    for layout in ("HND", "NHD"):
        q, k, v = qkv(2, 8, 4, n_q, n_k, d, dtype=torch.bfloat16, device="cuda", layout=layout)
        bs = BlockSparse.from_block_dense(blocks(2, 8, -(-n_q // 128), -(-n_k // 128), 0.3), 128, 128)
        for kw in ({}, {"attn_mask": keep}):
            runs = {}
            for limit in ({d: 512}, {}):  # staged (at either head dim), then global
                monkeypatch.setattr(gluon_attn, "LIST_LIMIT", limit)
                runs[bool(limit)] = sagegen.sageattn(q, k, v, tensor_layout=layout, backend="triton",
                                                     block_mask=bs, return_lse=True, **kw)
            (o1, l1), (o0, l0) = runs[True], runs[False]
            assert torch.equal(o1, o0) and torch.equal(l1, l0)
            check_empty(o1, l1, bs, n_q, layout)
    monkeypatch.setattr(gluon_attn, "LIST_LIMIT", {d: 16})
    assert gluon_attn.list_in_smem(d, 47) == 0 and gluon_attn.list_in_smem(d, 16) == 16
