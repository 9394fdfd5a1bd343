"""What would the K/V quantization pass cost inside the attention kernel? A probe copy of the Hopper Gluon
kernel in which every CTA, after its own attention work, does one item of the pass for its head: CTAs with
q-block index i < n_kb (key blocks of 128) quantize key block i (K to INT8 with its block scale, V to FP8
with the pass's per-channel scale, transposed, keys permuted), the next n_kb CTAs take V's channel min/max
over key block i - n_kb (the statistics launch's work). With Nq = Nk every (q-block) CTA does exactly one
item. Written to separate buffers, checked against the pass's own output, then timed next to the unchanged
kernel and the separate pass in one run.

If the kernel with the items is slower than the kernel alone by much less than the pass takes, moving the
pass into the kernel (items of head h done by CTAs of an earlier head, with per-head ready counters) would
pay; otherwise it cannot.

    python lab/probes/probe_fused_pass.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import sagegen  # noqa: E402,F401
from probe_util import bench_ms, environment, kernel_source, module_from_source, write_json  # noqa: E402
from sagegen.kernels import gluon_attn, triton_quant  # noqa: E402

SHAPES = [(4, 32, 8192, 128), (4, 32, 16384, 128), (2, 48, 17776, 64), (1, 24, 4608, 128)]

ITEM_SRC = '''

@gluon.jit
def _produce_item(K, V, KMean, VInv, K8, KSc, VQ, VMin, VMax, pid_bh, b, h, item, N, NK_PAD,
                  stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                  BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    n_kb = NK_PAD // BLOCK
    # V as [channels, stored key positions]: each thread 8 consecutive stored keys of one channel, so the
    # FP8 transpose is free (8-byte stores) and the loads stay coalesced across the warp (a row of channels)
    TPW_C: gl.constexpr = 32 if HEAD_DIM // NW >= 32 else HEAD_DIM // NW
    vl: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[TPW_C, 32 // TPW_C],
                                        warps_per_cta=[NW, 1], order=[1, 0])
    blk = item
    if item >= n_kb:
        blk = item - n_kb
    offs_c = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, vl))
    s = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, vl))
    # stored position s holds key a*8 + c*2 + e for s = c*4 + a*2 + e (within 16; gluon_attn._p_operand)
    key = blk * BLOCK + (s & ~15) + ((s >> 1) & 1) * 8 + ((s >> 2) & 3) * 2 + (s & 1)
    v_ptrs = (V + b.to(gl.int64) * stride_vb + h.to(gl.int64) * stride_vh + gl.expand_dims(key, 0) * stride_vn
              + gl.expand_dims(offs_c, 1) * stride_vd)
    v = gl.load(v_ptrs, mask=gl.expand_dims(key < N, 0), other=0.0).to(gl.float32)
    if item < n_kb:
        y = v * gl.expand_dims(gl.load(VInv + pid_bh * HEAD_DIM + offs_c), 1)
        y = gl.minimum(gl.maximum(y, -448.0), 448.0)
        vq_ptrs = (VQ + pid_bh.to(gl.int64) * HEAD_DIM * NK_PAD + gl.expand_dims(offs_c, 1) * NK_PAD
                   + gl.expand_dims(blk * BLOCK + s, 0))
        gl.store(vq_ptrs, y.to(gl.float8e4nv))

        TPW_D: gl.constexpr = HEAD_DIM // 8
        kl: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // TPW_D, TPW_D],
                                            warps_per_cta=[NW, 1], order=[1, 0])
        offs_n = blk * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, kl))
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kl))
        k_ptrs = (K + b.to(gl.int64) * stride_kb + h.to(gl.int64) * stride_kh + gl.expand_dims(offs_n, 1) * stride_kn
                  + gl.expand_dims(offs_d, 0) * stride_kd)
        k = gl.load(k_ptrs, mask=gl.expand_dims(offs_n < N, 1), other=0.0).to(gl.float32)
        k = k - gl.expand_dims(gl.load(KMean + pid_bh * HEAD_DIM + offs_d), 0)
        k = gl.where(gl.expand_dims(offs_n < N, 1), k, 0.0)
        amax = gl.maximum(gl.max(gl.max(gl.abs(k), axis=1), axis=0), _EPS)
        y = k * gl.div_rn(_INT8_MAX, amax)
        y = gl.where(y >= 0, y + 0.5, y - 0.5)
        y = gl.minimum(gl.maximum(y, -_INT8_MAX), _INT8_MAX)
        gl.store(K8 + pid_bh.to(gl.int64) * NK_PAD * HEAD_DIM + gl.expand_dims(offs_n, 1) * HEAD_DIM
                 + gl.expand_dims(offs_d, 0), y.to(gl.int8))
        gl.store(KSc + pid_bh * NK_PAD + offs_n, gl.full([BLOCK], 0.0, gl.float32, gl.SliceLayout(1, kl))
                 + gl.div_rn(amax, _INT8_MAX))
    elif item < 2 * n_kb:
        ok = gl.expand_dims(key < N, 0)
        out = (pid_bh * n_kb + blk) * HEAD_DIM + offs_c
        gl.store(VMin + out, gl.min(gl.where(ok, v, float("inf")), axis=1))
        gl.store(VMax + out, gl.max(gl.where(ok, v, float("-inf")), axis=1))
'''

SIG_OLD = "    q_desc, k_desc, v_desc, Q, QS, KS, VS, VM, KV_LEN, Out, Lse, CNT, IDX,\n"
SIG_NEW = ("    q_desc, k_desc, v_desc, Q, QS, KS, VS, VM, KV_LEN, Out, Lse, CNT, IDX,\n"
           "    PK, PV, PKM, PVI, PK8, PKS, PVQ, PMIN, PMAX, stride_pkb, stride_pkh, stride_pkn, stride_pkd,\n"
           "    stride_pvb, stride_pvh, stride_pvn, stride_pvd, PRODUCE: gl.constexpr,\n")
EPI_END = "              SMOOTH_V, RETURN_LSE, s_layout, o_layout)\n"
CALL = ("    if PRODUCE:\n"
        "        _produce_item(PK, PV, PKM, PVI, PK8, PKS, PVQ, PMIN, PMAX, pid_bh, b, h, start_m, N_K, NK_PAD,\n"
        "                      stride_pkb, stride_pkh, stride_pkn, stride_pkd, stride_pvb, stride_pvh, stride_pvn,\n"
        "                      stride_pvd, BLOCK_N, HEAD_DIM)\n")


def probe_module():
    src = kernel_source(gluon_attn)
    assert SIG_OLD in src and src.count(EPI_END) == 1, "gluon_attn changed: update the probe"
    src = src.replace(SIG_OLD, SIG_NEW).replace(EPI_END, EPI_END + CALL) + ITEM_SRC
    return module_from_source(src, "gluon_attn_fused_probe")


def launch(mod, qq, q, k, v, out, items, produce: bool):
    """gluon_attn.launch for the unmasked, no-LSE, no-V-smoothing call, with the item buffers."""
    import triton
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    b_, h, n, d = q.shape
    d_pad, nk_pad = qq.k8.shape[-1], qq.k8.shape[2]
    stages, maxnreg = mod.launch_settings(d_pad)
    q_l, k_l, v_l = mod.shared_layouts(64, 128, d_pad)
    k_desc = TensorDescriptor.from_tensor(qq.k8.view(-1, d_pad), [128, d_pad], k_l)
    v_desc = TensorDescriptor.from_tensor(qq.v.view(-1, nk_pad), [d_pad, 128], v_l)
    grid = (triton.cdiv(n, 64), b_ * h)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    mod._attn_fwd_sm90[grid](
        k_desc, k_desc, v_desc, q, qq.k_scale, qq.k_scale, qq.v_scale, qq.v_scale, qq.k_scale, out, qq.k_scale,
        qq.k_scale, qq.k_scale,  # no block-sparse lists
        k, v, qq.k_mean, items["v_inv"], items["k8"], items["k_scale"], items["vq"], items["vmin"], items["vmax"],
        *k.stride(), *v.stride(), produce,
        *q.stride(), *out.stride(), 0, 0, 0, 0, 0, 0, 0, h, 1, n, n, triton.cdiv(n, 64) * 64, nk_pad, d,
        d**-0.5 * 1.4426950408889634,
        BLOCK_M=64, BLOCK_N=128, HEAD_DIM=d_pad, STAGES=stages, HAS_KV_LEN=False, SMOOTH_V=False, RETURN_LSE=False,
        PERMUTED_V=True, QUANT_Q=True, PAD_D=False, SPARSE=False, q_layout=q_l, num_warps=4, enable_fp_fusion=True,
        **extra,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    mod = probe_module()
    cfg = sagegen.SageConfig()
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k = k + 2 * torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)
        quant = lambda: triton_quant.quantize(q, k, v, cfg, 64, 128, d, permute_v_keys=True, quantize_q=False)
        qq = quant()
        nk_pad, n_kb = qq.k8.shape[2], qq.k8.shape[2] // 128
        _, _, _, v_inv = triton_quant._kv_stats(k, v, d, cfg.smooth_k, False, True)  # the pass's own scales
        items = {"v_inv": v_inv, "k8": torch.zeros_like(qq.k8), "k_scale": torch.zeros_like(qq.k_scale),
                 "vq": torch.zeros_like(qq.v), "vmin": torch.zeros(b * h, n_kb, d, device=q.device),
                 "vmax": torch.zeros(b * h, n_kb, d, device=q.device)}
        out = torch.empty_like(q)
        launch(mod, qq, q, k, v, out, items, True)
        ref = torch.empty_like(q)
        gluon_attn.launch(qq, ref, None, None, H=h, group=1, n_q=n, n_k=n, d=d, block_m=64, block_n=128,
                          smooth_v=False, sm_scale_log2=d**-0.5 * 1.4426950408889634, q=q)
        torch.cuda.synchronize()
        vr = v.float().reshape(b * h, n, d)
        pad = nk_pad - n
        vmin_ref = torch.nn.functional.pad(vr, (0, 0, 0, pad), value=float("inf")).view(b * h, n_kb, 128, d).amin(2)
        vmax_ref = torch.nn.functional.pad(vr, (0, 0, 0, pad), value=float("-inf")).view(b * h, n_kb, 128, d).amax(2)
        check = {
            "out_equal": bool(torch.equal(out, ref)),
            "k8_equal": bool(torch.equal(items["k8"], qq.k8)),
            "k_scale_equal": bool(torch.equal(items["k_scale"][..., :n], qq.k_scale[..., :n])),
            "vq_mismatch_frac": (items["vq"].view(torch.uint8) != qq.v.view(torch.uint8)).float().mean().item(),
            "vminmax_equal": bool(torch.equal(items["vmin"], vmin_ref) and torch.equal(items["vmax"], vmax_ref)),
        }
        tf = lambda ms: 4 * b * h * n * n * d / ms / 1e9
        t_quant = bench_ms(quant)
        t_plain = bench_ms(lambda: launch(mod, qq, q, k, v, out, items, False))
        t_items = bench_ms(lambda: launch(mod, qq, q, k, v, out, items, True))
        t_plain2 = bench_ms(lambda: launch(mod, qq, q, k, v, out, items, False))
        row = {"shape": [b, h, n, d], **check, "pass_us": 1000 * t_quant,
               "kernel_us": [1000 * t_plain, 1000 * t_plain2],
               "kernel_with_items_us": 1000 * t_items,
               "items_cost_us": 1000 * (t_items - (t_plain + t_plain2) / 2),
               "kernel_tflops": tf(t_plain), "full_call_tflops_now": tf(t_plain + t_quant)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        q = k = v = qq = items = out = ref = None  # free before the next shape
        torch.cuda.empty_cache()
    write_json(args.out, environment=environment(), rows=rows)


if __name__ == "__main__":
    main()
