"""Block-sparse attention (`sageattn(block_mask=...)`): the Triton kernel (interpreter on CPU) against the
emulation, the emulation against the dense masked computation, FlexAttention BlockMask conversion, bad input.

Small odd sizes: ragged last blocks along both axes, empty q-blocks, GQA, both layouts. GPU twins (Gluon and
Triton at real sizes) are in test_gpu_sparse.py.
"""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import sagegen
from tests.support.helpers import qkv, rel_l1, to_hnd
from sagegen import BlockSparse, SageConfig
from sagegen.kernels.block_sparse import compact, kernel_tiles, tile_layout
from sagegen.kernels.reference import attention_fp64
from sagegen.kernels.spec import MaskSpec

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_blocks(b, h, nqb, nkb, density, empty_row=True, device=DEVICE):
    """A random bool block matrix with about `density` of the blocks, one q-block with none (if asked).
    The first q-block of every (batch, head) keeps one random key block, so the output is never all zeros
    (a relative error against zeros is undefined)."""
    blocks = torch.rand(b, h, nqb, nkb, device=device) < density
    blocks[:, :, 0, torch.randint(nkb, ())] = True
    if empty_row:
        blocks[0, 0, nqb - 1] = False
    return blocks


def assert_close(t, r, lse_t=None, lse_r=None):
    """Kernel vs emulation: they differ by fp32 summation order and exp2 rounding only (as in
    test_triton_interpret.py)."""
    assert t.shape == r.shape and t.dtype == r.dtype
    assert torch.isfinite(t).all()
    assert rel_l1(t, r) < 4e-3
    assert (t.float() - r.float()).abs().max() < 0.05
    if lse_t is not None:
        assert torch.equal(torch.isinf(lse_t), torch.isinf(lse_r))
        fin = torch.isfinite(lse_r)
        assert (lse_t[fin] - lse_r[fin]).abs().max() < 5e-3


def run_both(q, k, v, bs, **kw):
    t = sagegen.sageattn(q, k, v, backend="triton", block_mask=bs, return_lse=True, **kw)
    r = sagegen.sageattn(q, k, v, backend="reference", block_mask=bs, return_lse=True, **kw)
    return t, r


def empty_rows_are_zero(out, lse, bs, layout, n_q):
    """Rows of q-blocks with no key block: zeros and lse = -inf."""
    empty = (~bs.to_block_dense().any(-1)).repeat_interleave(bs.block_q, dim=2)[:, :, :n_q]  # [B', H', Nq]
    o = to_hnd(out, layout)
    empty = empty.expand(o.shape[0], o.shape[1], n_q)
    assert empty.any()
    assert (o[empty] == 0).all()
    assert torch.isneginf(lse[empty]).all()


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_kernel_matches_emulation_gqa_ragged_empty_rows(seed, layout):
    q, k, v = qkv(2, 4, 2, 200, 333, 64, layout=layout, device=DEVICE)
    bs = BlockSparse.from_block_dense(random_blocks(2, 4, 4, 3, 0.5), 64, 128)  # Hopper's tiles exactly
    (t, lt), (r, lr) = run_both(q, k, v, bs, tensor_layout=layout)
    assert_close(t, r, lt, lr)
    empty_rows_are_zero(t, lt, bs, layout, 200)
    empty_rows_are_zero(r, lr, bs, layout, 200)


def test_emulation_equals_the_dense_masked_computation(seed):
    """Skipping unlisted blocks is the dense computation with the equivalent bool mask, up to fp32 rounding
    (a fully masked block would move the reference max; a skipped one leaves it)."""
    q, k, v = qkv(2, 4, 4, 300, 290, 64, device=DEVICE)
    bs = BlockSparse.from_block_dense(random_blocks(1, 4, 3, 3, 0.4), 128, 128)
    o, lse = sagegen.sageattn(q, k, v, backend="reference", block_mask=bs, return_lse=True)
    od, lsed = sagegen.sageattn(q, k, v, backend="reference", attn_mask=bs.to_dense_mask(300, 290),
                                return_lse=True)
    assert (o.float() - od.float()).abs().max() <= 2e-3  # a few fp16 ulps at most
    assert torch.equal(torch.isinf(lse), torch.isinf(lsed))
    fin = torch.isfinite(lse)
    assert (lse[fin] - lsed[fin]).abs().max() < 1e-4


def test_against_fp64_with_the_dense_mask(seed):
    """Within the quantization's usual error of exact attention under the equivalent dense mask."""
    q, k, v = qkv(1, 2, 2, 256, 384, 128, device=DEVICE)
    blocks = random_blocks(1, 2, 2, 3, 0.6, empty_row=False)
    blocks[..., 0] = True  # no empty rows here: the relative error needs a reference everywhere
    bs = BlockSparse.from_block_dense(blocks, 128, 128)
    t = sagegen.sageattn(q, k, v, backend="triton", block_mask=bs)
    r = sagegen.sageattn(q, k, v, backend="reference", block_mask=bs)
    ref, _ = attention_fp64(q, k, v, sm_scale=128**-0.5, mask=MaskSpec("bool", bs.to_dense_mask(256, 384)))
    err_kernel, err_emu = rel_l1(t, ref), rel_l1(r, ref)  # ~0.035 for N(0,1) inputs: the quantization's own
    assert err_kernel < 0.05 and err_kernel < 1.1 * err_emu + 1e-3


def test_head_dim_128_and_larger_mask_blocks(seed):
    """Split head dim (SPLIT_D) and mask blocks that span several kernel tiles (256 x 256 -> 4 x 2 tiles)."""
    q, k, v = qkv(1, 2, 2, 300, 520, 128, device=DEVICE)
    bs = BlockSparse.from_block_dense(random_blocks(1, 1, 2, 3, 0.5), 256, 256)
    (t, lt), (r, lr) = run_both(q, k, v, bs)
    assert_close(t, r, lt, lr)
    empty_rows_are_zero(t, lt, bs, "HND", 300)


@pytest.mark.parametrize("cfg", [SageConfig(smooth_v=True), SageConfig(smooth_q=True, k_granularity="per_token"),
                                 SageConfig(pv_precision="fp16", q_granularity="per_block")],
                         ids=["smooth_v", "smooth_q-per_token_k", "fp16pv"])
def test_configs(seed, cfg):
    """Smoothing statistics stay over all keys (the lse correction q·mean(K) is per row, exact whatever
    blocks are skipped); V smoothing adds the mean back only to rows that attended to something."""
    q, k, v = qkv(1, 2, 2, 150, 270, 64, device=DEVICE)
    v = v + 3.0
    bs = BlockSparse.from_block_dense(random_blocks(1, 2, 3, 3, 0.5), 64, 128)
    (t, lt), (r, lr) = run_both(q, k, v, bs, config=cfg)
    assert_close(t, r, lt, lr)
    empty_rows_are_zero(t, lt, bs, "HND", 150)


def test_with_key_padding_and_general_masks_and_causal(seed):
    q, k, v = qkv(2, 2, 2, 140, 300, 64, device=DEVICE)
    bs = BlockSparse.from_block_dense(random_blocks(2, 1, 3, 3, 0.6), 64, 128)
    keep = torch.rand(2, 1, 1, 300, device=DEVICE) > 0.3
    general = torch.rand(2, 2, 140, 300, device=DEVICE) > 0.2
    for kw in (dict(attn_mask=keep), dict(attn_mask=general), dict(is_causal=True)):
        (t, lt), (r, lr) = run_both(q, k, v, bs, **kw)
        assert_close(t, r, lt, lr)


def test_flex_block_mask_input(seed):
    """A BlockMask from create_block_mask with a block-aligned mask_mod: the same call as its BlockSparse.
    Ragged last blocks count as partial in FlexAttention; they pass the check (the sequence ends there)."""
    n_q, n_k = 300, 400

    def near(b, h, qi, ki):
        return (qi // 128 - ki // 128).abs() <= (h % 2)

    bm = create_block_mask(near, None, 2, n_q, n_k, device=DEVICE)
    bs = BlockSparse.from_flex_block_mask(bm).validate()
    want = (torch.arange(3)[:, None] - torch.arange(4)[None, :]).abs() <= torch.tensor([0, 1])[:, None, None]
    assert torch.equal(bs.to_block_dense().cpu()[0], want)
    q, k, v = qkv(1, 2, 2, n_q, n_k, 64, device=DEVICE)
    t = sagegen.sageattn(q, k, v, backend="triton", block_mask=bm)
    assert torch.equal(t, sagegen.sageattn(q, k, v, backend="triton", block_mask=bs))
    assert sagegen.api._from_flex(bm) is sagegen.api._from_flex(bm)  # converted once per BlockMask
    r = sagegen.sageattn(q, k, v, backend="reference", attn_mask=bs.to_dense_mask(n_q, n_k))
    assert rel_l1(t, r) < 4e-3


def test_flex_partial_blocks_are_refused_or_kept_with_a_token_mask(seed):
    n = 256

    def causal(b, h, qi, ki):
        return qi >= ki

    bm = create_block_mask(causal, None, None, n, n, device=DEVICE)
    q, k, v = qkv(1, 2, 2, n, n, 64, device=DEVICE)
    with pytest.raises(ValueError, match="partial blocks.*partial_blocks='keep'"):
        sagegen.sageattn(q, k, v, backend="reference", block_mask=bm)
    bs = BlockSparse.from_flex_block_mask(bm, partial_blocks="keep")
    assert bs.counts.flatten().tolist() == [1, 2]
    token = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril()
    o = sagegen.sageattn(q, k, v, backend="reference", block_mask=bs, attn_mask=token)
    od = sagegen.sageattn(q, k, v, backend="reference", is_causal=True)
    assert (o.float() - od.float()).abs().max() <= 2e-3


def test_tile_layout_and_compact():
    """Mask blocks expand to kernel tiles (clipped at the ragged end); compaction lists them sorted."""
    blocks = torch.tensor([[[[True, False, True], [False, False, False]]]])
    bs = BlockSparse.from_block_dense(blocks, 128, 256)
    assert bs.counts.tolist() == [[[2, 0]]] and bs.indices[0, 0, 0, :2].tolist() == [0, 2]
    tiles = tile_layout(bs, 64, 128, n_q=200, n_k=600)  # 4 q-tiles, 5 key tiles (the last mask block ragged)
    assert tiles.shape == (1, 1, 4, 5)
    assert tiles[0, 0, :, :].int().tolist() == [[1, 1, 0, 0, 1]] * 2 + [[0] * 5] * 2
    counts, idx = kernel_tiles(bs, 64, 128, 200, 600, key_lengths=torch.tensor([300, 600], dtype=torch.int32))
    assert counts[:, 0].tolist() == [[2, 2, 0, 0], [3, 3, 0, 0]]  # batch 0 has 3 key tiles, batch 1 has 5
    assert idx[1, 0, 0, :3].tolist() == [0, 1, 4] and idx[1, 0, 3].tolist() == [0] * 5
    assert bs.to("cpu").indices.device.type == "cpu" and bs.density().flatten().tolist() == pytest.approx([2 / 3, 0])
    c, i = compact(torch.tensor([False, True, False, True]))
    assert c.item() == 2 and i.tolist() == [1, 3, 0, 0]


def test_fully_empty_mask_and_torch_compile(seed):
    q, k, v = qkv(1, 2, 2, 100, 130, 64, device=DEVICE, layout="NHD")
    bs = BlockSparse.from_block_dense(torch.zeros(1, 1, 2, 2, dtype=torch.bool, device=DEVICE), 64, 128)
    out, lse = sagegen.sageattn(q, k, v, tensor_layout="NHD", backend="triton", block_mask=bs, return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    bs = BlockSparse.from_block_dense(random_blocks(1, 2, 2, 2, 0.5), 64, 128)

    def f(q, k, v, bs):
        o, lse = sagegen.sageattn(q, k, v, tensor_layout="NHD", block_mask=bs, return_lse=True, backend="reference")
        return o * 2, lse

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    o, lse = compiled(q, k, v, bs)
    eager_o, eager_lse = f(q, k, v, bs)
    assert torch.equal(o, eager_o) and torch.equal(lse, eager_lse)
    torch.library.opcheck(torch.ops.sagegen.sageattn.default,
                          (q, k, v, None, False, 0.125, "NHD", True, "reference",
                           *sagegen.api._config_args(SageConfig()), *bs),
                          test_utils=("test_schema", "test_faketensor"))


def test_sdpa_fallback_folds_the_block_mask(seed):
    """The SDPA fallback computes every block, so it gets the equivalent dense mask."""
    from sagegen.kernels import dispatch as backends

    q, k, v = qkv(1, 2, 2, 130, 250, 64, device=DEVICE)
    bs = BlockSparse.from_block_dense(random_blocks(1, 2, 3, 2, 0.5), 64, 128)
    out = torch.empty_like(q)
    backends.run("sdpa", q, k, v, out, sm_scale=0.125, is_causal=False, mask=MaskSpec(), attn_mask=None,
                 config=SageConfig(), return_lse=False, block_sparse=bs)
    ref, _ = attention_fp64(q, k, v, sm_scale=0.125, mask=MaskSpec("bool", bs.to_dense_mask(130, 250)))
    assert (out.double() - ref).abs().max() < 5e-3


def test_bad_block_masks_are_refused_clearly():
    q, k, v = qkv(1, 2, 2, 200, 300, 64, device=DEVICE)
    good = BlockSparse.from_block_dense(torch.ones(1, 2, 4, 3, dtype=torch.bool, device=DEVICE), 64, 128)
    call = lambda bm, **kw: sagegen.sageattn(q, k, v, backend="reference", block_mask=bm, **kw)
    with pytest.raises(ValueError, match=r"not multiples of the kernel's 64 x 128 tiles.*128 x 128"):
        call(BlockSparse.from_block_dense(torch.ones(1, 1, 4, 5, dtype=torch.bool, device=DEVICE), 64, 64))
    with pytest.raises(ValueError, match="indices must be an int32 tensor"):
        call(good._replace(indices=good.indices.long()))
    with pytest.raises(ValueError, match="counts must be an int32 tensor with 3 dims"):
        call(good._replace(counts=good.counts[0]))
    with pytest.raises(ValueError, match=r"does not fit this call: Nq=200, Nk=300"):
        call(good._replace(indices=good.indices[..., :2]))
    with pytest.raises(ValueError, match="does not fit"):  # 3 heads do not broadcast to 2
        call(BlockSparse.from_block_dense(torch.ones(1, 3, 4, 3, dtype=torch.bool, device=DEVICE), 64, 128))
    with pytest.raises(ValueError, match="must be the counts' shape|must be counts' shape"):
        call(good._replace(indices=good.indices[:, :1]))
    with pytest.raises(TypeError, match="block_mask must be a sagegen.BlockSparse"):
        call(torch.ones(4, 3, dtype=torch.bool))
    bm = create_block_mask(lambda b, h, qi, ki: qi >= 0, None, None, 256, 300, device=DEVICE)
    with pytest.raises(ValueError, match=r"built for \(Q_LEN, KV_LEN\) = \(256, 300\).*Nq=200, Nk=300"):
        call(bm)
    with pytest.raises(ValueError, match="sorted ascending"):
        good._replace(indices=good.indices.flip(-1).contiguous()).validate()
    with pytest.raises(ValueError, match="outside"):
        good._replace(indices=good.indices + 1).validate()
    with pytest.raises(ValueError, match="partial_blocks"):
        BlockSparse.from_flex_block_mask(bm, partial_blocks="ignore")


SPARSE_CODEGEN = """
import json, sys
sys.path.insert(0, "bench")
from compile_check import compile_attn, compile_gluon, summary
from sagegen.config import SageConfig
from sagegen.kernels import triton_attn
d = int(sys.argv[1])
warps, stages, *_ = triton_attn.launch_settings(64, 128, d)
print(json.dumps([summary(compile_gluon(d, extra_const={"SPARSE": True}))]
                 + [summary(compile_attn(d, SageConfig(), num_warps=warps, num_stages=stages, SPARSE=sparse))
                    for sparse in (True, False)]))
"""


@pytest.mark.parametrize("d", [64, 128])
def test_sparse_kernels_compile_for_hopper_without_spills(d):
    """Both block-sparse kernels build for sm90 without a GPU: tensor-core ops, no register spills, and the
    Triton kernel's K/V loads pipelined as in the dense kernel (as much shared memory: the same ring)."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SPARSE_CODEGEN, str(d)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    gluon, triton_kernel, triton_dense = json.loads(done.stdout.strip().splitlines()[-1])
    for report in (gluon, triton_kernel):
        assert report["stack"] == 0 and report["ldl/stl"] == 0, report
        assert {"IGMMA", "QGMMA"} <= set(report["matrix_ops"]), report
    assert gluon["shfl_idx"] == 0, gluon
    assert triton_kernel["shared_bytes"] >= triton_dense["shared_bytes"], (triton_kernel, triton_dense)
