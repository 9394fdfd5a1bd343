"""Triton attention kernel: INT8 Q·Kᵀ, FP8 (or fp16) P·V with two-level accumulation, online softmax.

Scores live in log2 units (the softmax scale and log2(e) fold into the per-row Q scale) so the kernel uses
`exp2`; the FP8 scale of P folds into the exponent, so P comes out of `exp2` ready for its cast, with each
key block's row max on 448 (e4m3's largest value): the accumulator is kept relative to the current block's
max (within a window below the running max), which costs nothing over the usual running-max rescale. Each
key block's P·V is computed fresh by the tensor cores and then added into an FP32 accumulator (two-level
accumulation): the FP8 tensor cores' ~22-bit accumulator never spans more than one block.

Q, K and V come from `triton_quant.quantize` as padded, contiguous buffers read through TMA tensor
descriptors; this module knows nothing of the public API's layouts beyond the output's strides.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from sagegen.config import SageConfig
from sagegen.kernels.block_sparse import kernel_tiles, sparse_args
from sagegen.kernels.spec import (FP8_MAX, LOG2E, LOG2_FP8_MAX, MaskSpec, REF_WINDOW, cdiv)
from sagegen.kernels.triton_quant import interpreting, round_to_e4m3_grid

MASK_NONE, MASK_KEY, MASK_BOOL, MASK_ADD = 0, 1, 2, 3
_MASK_KINDS = {"none": MASK_NONE, "key": MASK_KEY, "bool": MASK_BOOL, "additive": MASK_ADD}
# int32 -> fp32 without a conversion instruction: the bits of 1.5·2^23 + i read as fp32 equal 12582912 + i
# exactly for |i| < 2^22, and |Q·Kᵀ| <= 127²·128 < 2^21 for head dims up to 128.
_LOG2_FP8_MAX = tl.constexpr(LOG2_FP8_MAX)
_FP8_MAX = tl.constexpr(FP8_MAX)
_REF_WINDOW = tl.constexpr(REF_WINDOW)


@triton.jit
def _pv_update(acc, pq, v_desc, row0, start_n, d_off, alpha, PV_FP8: tl.constexpr):
    """acc * alpha + P·V over one key block (accumulated fresh: the first level), for one head-dim chunk."""
    if PV_FP8:
        v = v_desc.load([row0 + d_off, start_n])  # [CHUNK_D, BLOCK_N]: V stored transposed (K-major for FP8)
        part = tl.dot(pq, tl.trans(v))
    else:
        v = v_desc.load([row0 + start_n, d_off])
        part = tl.dot(pq, v)
    return acc * alpha[:, None] + part


@triton.jit
def _exp2_shift(row_scale, r):
    """The fast path's shift for p = exp2(x * row_scale - shift), x = 12582912 + score, aiming a block's max
    at 448 relative to reference r, and the reference it really subtracts: ~12582912 * row_scale, fp32 holds
    r only to its ulp, so acc, l and the lse follow the reference actually used (spec.py)."""
    shift = row_scale * 12582912.0 + r - _LOG2_FP8_MAX
    return shift, tl.fma(-row_scale, 12582912.0, shift) + _LOG2_FP8_MAX


@triton.jit
def _store_out(acc, offs_d, inv_l, l_i, VS, VM, OS, vs_off, o_base, offs_m, stride_om, stride_od, N_Q, D,
               SMOOTH_V: tl.constexpr, OUT_FP8: tl.constexpr, EXACT_FP8_CAST: tl.constexpr):
    o = acc * inv_l[:, None]
    o = o * tl.load(VS + vs_off + offs_d)[None, :]  # V's scale: FP8's, or fp16's power of two (spec.FP16_V_EXP)
    if SMOOTH_V:
        v_mean = tl.load(VM + vs_off + offs_d)
        o = tl.where((l_i != 0)[:, None], o + v_mean[None, :], 0.0)
    if OUT_FP8:  # e4m3 with the call's scale from V's range (fp8_out.py); the GPU's conversion saturates
        o = o * tl.load(OS)
        if EXACT_FP8_CAST:  # the interpreter's does not: clamp (NaN kept), then round exactly
            o = round_to_e4m3_grid(tl.where(o != o, o, tl.minimum(tl.maximum(o, -_FP8_MAX), _FP8_MAX)))
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(o_base.dtype.element_ty), mask=(offs_m < N_Q)[:, None] & (offs_d < D)[None, :])


@triton.jit
def _attn_block(
    q, q_scale, m_i, r_i, l_i, acc0, acc1, start_n, offs_m, k_desc, v_desc, kv_row0, v_row0, ks_base,
    qb_row, msk_base, stride_mm, stride_mn, N_Q, N_K,
    BLOCK_N: tl.constexpr, CHUNK_D: tl.constexpr, FAST: tl.constexpr, TAIL: tl.constexpr,
    CAUSAL: tl.constexpr, K_PER_TOKEN: tl.constexpr, MASK_KIND: tl.constexpr, SMOOTH_Q: tl.constexpr,
    PV_FP8: tl.constexpr, EXACT_FP8_CAST: tl.constexpr, SPLIT_D: tl.constexpr,
):
    """One key block of the online softmax; TAIL blocks check key bounds (and causality)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = k_desc.load([kv_row0 + start_n, 0])
    qk = tl.dot(q, tl.trans(k))
    x = (qk + 0x4B400000).to(tl.float32, bitcast=True)  # 12582912 + qk, exactly
    if FAST:
        # Nothing depends on the key column but the score: max and exp2 work on x, and the scale and the
        # shift become one FMA inside the exponent: exp2(s - m + log2 448), s = (x - 12582912) * row_scale.
        row_scale = q_scale * tl.load(ks_base + start_n)
        if TAIL:
            x = tl.where((offs_n < N_K)[None, :], x, float("-inf"))
        m_blk = (tl.max(x, axis=1) - 12582912.0) * row_scale
        m_new = tl.maximum(m_i, m_blk)
        r_new = tl.maximum(m_blk, m_new - _REF_WINDOW)
        shift, r_new = _exp2_shift(row_scale, r_new)
        # an explicit FMA: the product is exact inside it (the GPU fuses this anyway; the interpreter would not)
        p = tl.math.exp2(tl.fma(x, row_scale[:, None], -shift[:, None]))
        alpha = tl.math.exp2(r_i - r_new)
    else:
        if K_PER_TOKEN:
            s = ((x - 12582912.0) * q_scale[:, None]) * tl.load(ks_base + offs_n)[None, :]
        else:
            s = (x - 12582912.0) * (q_scale * tl.load(ks_base + start_n))[:, None]
        if SMOOTH_Q:
            s += tl.load(qb_row + offs_n)[None, :]
        if MASK_KIND == 1:
            s += tl.load(msk_base + offs_n * stride_mn, mask=offs_n < N_K, other=float("-inf"))[None, :]
        elif MASK_KIND != 0:
            m_ptrs = msk_base + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn
            in_bounds = (offs_m < N_Q)[:, None] & (offs_n < N_K)[None, :]
            if MASK_KIND == 2:
                s = tl.where(tl.load(m_ptrs, mask=in_bounds, other=0) != 0, s, float("-inf"))
            else:
                s += tl.load(m_ptrs, mask=in_bounds, other=0.0).to(tl.float32) * 1.4426950408889634
        if TAIL:
            s = tl.where((offs_n < N_K)[None, :], s, float("-inf"))
            if CAUSAL:
                s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        m_blk = tl.max(s, axis=1)
        m_new = tl.maximum(m_i, m_blk)
        r_new = tl.maximum(m_blk, m_new - _REF_WINDOW)
        r_safe = tl.where(r_new == float("-inf"), 0.0, r_new)  # rows with every key masked so far
        p = tl.math.exp2(s - (r_safe - _LOG2_FP8_MAX)[:, None])
        alpha = tl.math.exp2(r_i - r_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if PV_FP8:
        if EXACT_FP8_CAST:
            p = round_to_e4m3_grid(p)
        pq = p.to(tl.float8e4nv)
    else:
        pq = p.to(tl.float16)
    acc0 = _pv_update(acc0, pq, v_desc, v_row0, start_n, 0, alpha, PV_FP8)
    if SPLIT_D:
        acc1 = _pv_update(acc1, pq, v_desc, v_row0, start_n, CHUNK_D, alpha, PV_FP8)
    return m_new, r_new, l_i, acc0, acc1


@triton.jit
def _attn_fwd_kernel(
    q_desc, k_desc, v_desc, QS, KS, VS, VM, QB, MSK, Out, OS, Lse, CNT, IDX,
    stride_qbm,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_cb, stride_ch, stride_ib, stride_ih, stride_im,
    H, GROUP, N_Q, N_K, NQ_PAD, NK_PAD, D, sm_scale_log2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr, K_PER_TOKEN: tl.constexpr, MASK_KIND: tl.constexpr,
    SMOOTH_Q: tl.constexpr, SMOOTH_V: tl.constexpr, PV_FP8: tl.constexpr, RETURN_LSE: tl.constexpr,
    EXACT_FP8_CAST: tl.constexpr, SPLIT_D: tl.constexpr, SPARSE: tl.constexpr, OUT_FP8: tl.constexpr,
):
    start_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    # The fast path: nothing depends on the key column but the score itself, so max, scale and exp2 work
    # on the raw integer scores and the scale becomes one FMA inside the exponent.
    FAST: tl.constexpr = (not CAUSAL) and (not K_PER_TOKEN) and (MASK_KIND == 0) and (not SMOOTH_Q)

    q = q_desc.load([pid_bh * NQ_PAD + start_m * BLOCK_M, 0])
    q_scale = tl.load(QS + pid_bh * NQ_PAD + offs_m) * sm_scale_log2
    ks_base = KS + bh_kv * NK_PAD
    kv_row0 = bh_kv * NK_PAD

    CHUNK_D: tl.constexpr = HEAD_DIM // 2 if SPLIT_D else HEAD_DIM
    v_row0 = bh_kv * HEAD_DIM if PV_FP8 else kv_row0
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running row max of the scores
    r_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # the max that acc and l are relative to
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Head-dim columns in one or two chunks: two halves keep the fresh per-block P·V result (which two-level
    # accumulation needs besides the accumulator) small enough not to spill registers at head dim 128.
    acc0 = tl.zeros([BLOCK_M, CHUNK_D], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, CHUNK_D], dtype=tl.float32)

    qb_row = QB + (pid_bh * (NQ_PAD // BLOCK_M) + start_m) * stride_qbm
    msk_base = MSK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    if SPARSE:
        # Only the listed key tiles (block_sparse.kernel_tiles: sorted, so only the last can be ragged). An
        # empty q-tile computes tile 0 (entries past the count are 0) and discards it below.
        cnt = tl.load(CNT + b * stride_cb + h * stride_ch + start_m)
        idx_row = IDX + b.to(tl.int64) * stride_ib + h.to(tl.int64) * stride_ih + start_m * stride_im
        n_iter = tl.maximum(cnt, 1)
        n_whole = n_iter if CAUSAL else n_iter - 1  # causal: every tile checks the diagonal
        start_n = tl.load(idx_row) * BLOCK_N
        for i in range(0, n_whole):
            # the next tile's index is read a step ahead (loop-carried), so no load feeds this step's addresses
            start_next = tl.load(idx_row + i + 1, mask=i + 1 < n_iter, other=0) * BLOCK_N
            m_i, r_i, l_i, acc0, acc1 = _attn_block(
                q, q_scale, m_i, r_i, l_i, acc0, acc1, start_n, offs_m, k_desc, v_desc,
                kv_row0, v_row0, ks_base, qb_row, msk_base, stride_mm, stride_mn, N_Q, N_K, BLOCK_N, CHUNK_D, FAST,
                CAUSAL, CAUSAL, K_PER_TOKEN, MASK_KIND, SMOOTH_Q, PV_FP8, EXACT_FP8_CAST, SPLIT_D)
            start_n = start_next
        if not CAUSAL:
            m_i, r_i, l_i, acc0, acc1 = _attn_block(
                q, q_scale, m_i, r_i, l_i, acc0, acc1, start_n, offs_m, k_desc,
                v_desc, kv_row0, v_row0, ks_base, qb_row, msk_base, stride_mm, stride_mn, N_Q, N_K, BLOCK_N,
                CHUNK_D, FAST, True, CAUSAL, K_PER_TOKEN, MASK_KIND, SMOOTH_Q, PV_FP8, EXACT_FP8_CAST, SPLIT_D)
        l_i = tl.where(cnt > 0, l_i, 0.0)  # zeros and lse = -inf, as a fully masked row
        acc0 = tl.where(cnt > 0, acc0, 0.0)
        acc1 = tl.where(cnt > 0, acc1, 0.0)
    elif CAUSAL:
        for start_n in range(0, tl.minimum(N_K, (start_m + 1) * BLOCK_M), BLOCK_N):
            m_i, r_i, l_i, acc0, acc1 = _attn_block(
                q, q_scale, m_i, r_i, l_i, acc0, acc1, start_n, offs_m, k_desc, v_desc, kv_row0, v_row0,
                ks_base, qb_row, msk_base, stride_mm, stride_mn, N_Q, N_K, BLOCK_N, CHUNK_D, FAST, True,
                CAUSAL, K_PER_TOKEN, MASK_KIND, SMOOTH_Q, PV_FP8, EXACT_FP8_CAST, SPLIT_D)
    else:
        # Whole key blocks need no bounds check; the partial last block is peeled off.
        n_full = (N_K // BLOCK_N) * BLOCK_N
        for start_n in range(0, n_full, BLOCK_N):
            m_i, r_i, l_i, acc0, acc1 = _attn_block(
                q, q_scale, m_i, r_i, l_i, acc0, acc1, start_n, offs_m, k_desc, v_desc, kv_row0, v_row0,
                ks_base, qb_row, msk_base, stride_mm, stride_mn, N_Q, N_K, BLOCK_N, CHUNK_D, FAST, False,
                CAUSAL, K_PER_TOKEN, MASK_KIND, SMOOTH_Q, PV_FP8, EXACT_FP8_CAST, SPLIT_D)
        if n_full < N_K:
            m_i, r_i, l_i, acc0, acc1 = _attn_block(
                q, q_scale, m_i, r_i, l_i, acc0, acc1, n_full, offs_m, k_desc, v_desc, kv_row0, v_row0,
                ks_base, qb_row, msk_base, stride_mm, stride_mn, N_Q, N_K, BLOCK_N, CHUNK_D, FAST, True,
                CAUSAL, K_PER_TOKEN, MASK_KIND, SMOOTH_Q, PV_FP8, EXACT_FP8_CAST, SPLIT_D)

    # acc and l both carry P's factor 448, which cancels here.
    inv_l = tl.where(l_i != 0, 1.0 / tl.where(l_i != 0, l_i, 1.0), 0.0)
    vs_off = bh_kv * HEAD_DIM
    o_base = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh  # no wrap past 2^31
    offs_d0 = tl.arange(0, CHUNK_D)
    _store_out(acc0, offs_d0, inv_l, l_i, VS, VM, OS, vs_off, o_base, offs_m, stride_om, stride_od, N_Q, D,
               SMOOTH_V, OUT_FP8, EXACT_FP8_CAST)
    if SPLIT_D:
        _store_out(acc1, CHUNK_D + offs_d0, inv_l, l_i, VS, VM, OS, vs_off, o_base, offs_m, stride_om, stride_od,
                   N_Q, D, SMOOTH_V, OUT_FP8, EXACT_FP8_CAST)
    if RETURN_LSE:
        lse = (r_i + tl.math.log2(l_i) - _LOG2_FP8_MAX) * 0.6931471805599453
        tl.store(Lse + b * stride_lb + h * stride_lh + offs_m, lse, mask=offs_m < N_Q)


# Launch settings per (block_m, block_n, head_dim); tuned on an H200 (lab/probes/tune_attention.py), and
# overridable for tuning runs.
LAUNCH_OVERRIDES: dict[tuple[int, int, int], tuple] = {}


def launch_settings(block_m: int, block_n: int, head_dim: int, capability=None) -> tuple:
    """(num_warps, num_stages[, maxnreg]): one warpgroup per 64-row tile, so two CTAs share an SM and one's
    softmax overlaps the other's tensor-core work; three stages of TMA loads in flight."""
    key = (block_m, block_n, head_dim)
    if key in LAUNCH_OVERRIDES:
        return LAUNCH_OVERRIDES[key]
    if capability is not None and tuple(capability) < (9, 0):
        return (8 if block_m >= 128 else 4), 2  # cp.async double buffering; no TMA before Hopper
    if (block_m, block_n, head_dim) == (64, 128, 128):
        # Capping registers at 168 lets three CTAs share an SM (lab/data/tune-*.json: +5%).
        return 4, 2, 168
    return (8 if block_m >= 128 else 4), 3


def launch(q: torch.Tensor, k: torch.Tensor, qq, out: torch.Tensor, *, sm_scale: float, is_causal: bool,
           mask: MaskSpec, config: SageConfig, return_lse: bool, block_q: int, block_k: int, d_pad: int,
           capability, block_sparse=None, out_inv: torch.Tensor | None = None) -> torch.Tensor | None:
    """The portable Triton kernel on quantized buffers ``qq`` (`triton_quant.quantize`), written into ``out``.

    Args:
        q, k: the unquantized Q [B, Hq, Nq, D] and K [B, Hkv, Nk, D] (Q smoothing and the LSE read them).
        mask: as `sagegen.sageattn`'s, normalised; out_inv: the FP8 output's inverse scale (`fp8_out`), or None.
        The rest as `sagegen.kernels.launch.sage_attention`, which chooses this kernel or the Gluon one.

    Returns:
        lse [B, Hq, Nq] fp32 if return_lse else None.
    """
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    c = sm_scale * LOG2E
    q_bias = qq.q_scale  # placeholder pointer when unused
    if config.smooth_q:
        ks = (k.float() - qq.k_mean[:, :, None, :D]) if qq.k_mean is not None else k.float()
        ks = ks.repeat_interleave(H // Hkv, dim=1) if Hkv != H else ks
        q_bias = torch.zeros(B, H, qq.q_block_mean.shape[2], qq.k8.shape[2], device=q.device)
        q_bias[..., :Nk] = (qq.q_block_mean[..., :D] @ ks.transpose(-1, -2)) * c

    kind = _MASK_KINDS[mask.kind]
    m_arg = mask.tensor if mask.tensor is not None else qq.q_scale
    if kind == MASK_KEY:
        m_arg = (mask.tensor.float() * LOG2E).contiguous()
        m_strides = (m_arg.stride(0), 0, 0, m_arg.stride(1))
    elif kind in (MASK_BOOL, MASK_ADD):
        if kind == MASK_BOOL:
            m_arg = m_arg.view(torch.int8) if m_arg.element_size() == 1 else m_arg.to(torch.int8)
        m_arg = m_arg.expand(B, H, Nq, Nk)
        m_strides = m_arg.stride()
    else:
        m_strides = (0, 0, 0, 0)

    lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device) if return_lse else qq.q_scale
    vs = qq.v_scale  # FP8's scales, or fp16's powers of two
    vm = qq.v_mean if qq.v_mean is not None else vs
    nq_pad, nk_pad = qq.q8.shape[2], qq.k8.shape[2]
    chunk_d = d_pad // 2 if d_pad >= 128 else d_pad
    q_desc = TensorDescriptor.from_tensor(qq.q8.view(-1, d_pad), [block_q, d_pad])
    k_desc = TensorDescriptor.from_tensor(qq.k8.view(-1, d_pad), [block_k, d_pad])
    if config.pv_precision == "fp8":
        v_desc = TensorDescriptor.from_tensor(qq.v.view(-1, nk_pad), [chunk_d, block_k])
    else:
        v_desc = TensorDescriptor.from_tensor(qq.v.view(-1, d_pad), [block_k, chunk_d])
    grid = (cdiv(Nq, block_q), B * H)
    tiles = kernel_tiles(block_sparse, block_q, block_k, Nq, Nk) if block_sparse is not None else None
    sparse_ptrs, sparse_strides = sparse_args(tiles, qq.k_scale)
    num_warps, num_stages, *maxnreg = launch_settings(block_q, block_k, d_pad, capability)
    extra = {"maxnreg": maxnreg[0]} if maxnreg else {}
    _attn_fwd_kernel[grid](
        q_desc, k_desc, v_desc, qq.q_scale, qq.k_scale, vs, vm, q_bias, m_arg, out,
        out_inv if out_inv is not None else vs, lse, *sparse_ptrs,
        q_bias.stride(2) if config.smooth_q else 0,
        *m_strides, *out.stride(), lse.stride(0) if return_lse else 0, lse.stride(1) if return_lse else 0,
        *sparse_strides,
        H, H // Hkv, Nq, Nk, nq_pad, nk_pad, D, sm_scale * LOG2E,
        BLOCK_M=block_q, BLOCK_N=block_k, HEAD_DIM=d_pad,
        CAUSAL=is_causal, K_PER_TOKEN=config.k_granularity == "per_token", MASK_KIND=kind,
        SMOOTH_Q=config.smooth_q, SMOOTH_V=config.smooth_v, PV_FP8=config.pv_precision == "fp8",
        RETURN_LSE=return_lse, EXACT_FP8_CAST=interpreting(), SPLIT_D=d_pad >= 128, SPARSE=tiles is not None,
        OUT_FP8=out_inv is not None,
        num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=True, **extra,
    )
    return finish_lse(lse, q, qq, H, Hkv, D, sm_scale) if return_lse else None


def finish_lse(lse, q, qq, H, Hkv, D, sm_scale):
    """Add back what K smoothing took out of every score of a row: q · mean(K) · scale."""
    if qq.k_mean is not None:
        k_mean = qq.k_mean[..., :D].repeat_interleave(H // Hkv, dim=1) if Hkv != H else qq.k_mean[..., :D]
        lse += (q.float() @ k_mean[..., None])[..., 0] * sm_scale
    return lse
