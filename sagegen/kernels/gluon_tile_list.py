"""The block-sparse loop's key-tile list for `gluon_attn`: read from global memory step by step (`kv_tile`), or
staged once per CTA in shared memory with the listed tiles' K scales (``LIST_IN_SMEM``, chosen by
`gluon_attn.list_in_smem`) and read there by the loop (`tile_at`, `scale_at`)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# The CTA barrier and the shared-memory view's method were renamed after Triton 3.6 / 3.8.
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
_PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def kv_tile(idx_row, i, n_iter, SPARSE: gl.constexpr):
    """The key tile of the loop's i-th step: i, or the i-th listed tile of a block-sparse mask (0 past the end)."""
    if SPARSE:
        return gl.load(idx_row + i, mask=i < n_iter, other=0)
    else:
        return i + n_iter * 0  # a tensor either way: the loop carries it


@gluon.jit
def staged(values, MAX_TILES: gl.constexpr, dtype: gl.constexpr):
    """A [MAX_TILES] list in shared memory (LIST_IN_SMEM), visible to the whole CTA when this returns."""
    smem_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # each entry a [1] view (`index`)
    flat = gl.allocate_shared_memory(dtype, [MAX_TILES], smem_l, values)
    _cta_barrier()
    if _PUBLIC_REINTERPRET:  # (the method's name after Triton 3.8)
        return flat.reinterpret(dtype, [MAX_TILES, 1], smem_l)
    else:
        return flat._reinterpret(dtype, [MAX_TILES, 1], smem_l)


@gluon.jit
def tile_list(idx_row, cnt, MAX_TILES: gl.constexpr):
    """A q-tile's key-tile list, read once (LIST_IN_SMEM); entries past it are tile 0, as `kv_tile` gives."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = gl.arange(0, MAX_TILES, layout=layout)
    return gl.load(idx_row + offs, mask=offs < cnt, other=0)


@gluon.jit
def list_entry(smem, i, MAX_TILES: gl.constexpr):
    """Entry i of a staged list (its last entry past the end: the loop reads ahead but does not use those)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    return gl.max(smem.index(gl.minimum(i, MAX_TILES - 1)).load(layout), axis=0)


@gluon.jit
def tile_at(idx_row, tile_smem, i, n_iter, SPARSE: gl.constexpr, LIST_IN_SMEM: gl.constexpr,
             MAX_TILES: gl.constexpr):
    if LIST_IN_SMEM:
        return list_entry(tile_smem, i, MAX_TILES)
    else:
        return kv_tile(idx_row, i, n_iter, SPARSE)


@gluon.jit
def scale_at(ks_base, ks_smem, tile, i, LIST_IN_SMEM: gl.constexpr, MAX_TILES: gl.constexpr,
              BLOCK_N: gl.constexpr):
    """K's scale of the loop's i-th key tile `tile`."""
    if LIST_IN_SMEM:
        return list_entry(ks_smem, i, MAX_TILES)
    else:
        return gl.load(ks_base + tile * BLOCK_N)
