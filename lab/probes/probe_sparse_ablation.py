"""What each CTA's fixed work costs in the Hopper kernel (issue 20: the sparse call's intercept at d = 0.1).

Copies of `gluon_attn` with one part's memory traffic switched off by a predicate that is false at run time
(the instructions still issue, so the arithmetic stays): `nostore` (the output store), `noqload` (Q's load
before its in-kernel quantization), `neither`. Each is timed against the unmodified kernel on the same
buffers, in alternating rounds, with every q-tile given c key tiles (c = 1, 4, 16) and at d = 0.1 (random
128 x 128 blocks, diagonal kept). The traffic floor of Q's read and O's write (`out.copy_(q)`) is timed too.
Outputs of the copies are wrong by design; nothing here is a product change.

    python lab/probes/probe_sparse_ablation.py --out $OUT/probe-sparse-ablation.json

The edits match `gluon_attn.py` as it was before the epilogue change they led to (commit d829e42; the kernel now
stores as `cvt` does): check that file out to run the probe again. Results: lab/NOTES.md v7.4.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from bench_sparse import environment, random_block_mask, time_ms  # noqa: E402
from probe_sparse_fixed_cost import fixed_tiles  # noqa: E402
from sagegen import BlockSparse  # noqa: E402
from sagegen.kernels import gluon_attn, triton_attn, triton_quant  # noqa: E402
from sagegen.kernels.block_sparse import kernel_tiles  # noqa: E402

SHAPES = [(2, 48, 17776, 64), (1, 24, 32768, 128), (1, 24, 4608, 128), (2, 38, 4429, 64)]  # + Flux, SD3.5
STORE = "gl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=o_mask)"
QLOAD = "x = gl.load(ptrs, mask=valid, other=0.0).to(gl.float32)"
EDITS = {
    "nostore": [(STORE, STORE.replace("mask=o_mask", "mask=o_mask & (N_Q < 0)"))],
    "noqload": [(QLOAD, QLOAD.replace("mask=valid", "mask=valid & (N_Q < 0)").replace("other=0.0", "other=1.0"))],
}
EDITS["neither"] = EDITS["nostore"] + EDITS["noqload"]
# Candidates for the store itself. `cvt`: through a 16-byte-per-thread blocked layout (the compiler stages it in
# shared memory). `tma`: the tile written to a free K ring slot, then one TMA store (contiguous [B, H, N, D] out
# only; the last, partial tile of a head keeps the plain store).
ST = "    " + STORE
EDITS["cvt"] = [(ST, """    ST_TPW: gl.constexpr = HEAD_DIM // 8
    st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // ST_TPW, ST_TPW], [gl.num_warps(), 1], [1, 0])
    o_st = gl.convert_layout(o.to(Out.dtype.element_ty), st_layout)
    offs_ms = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, st_layout))
    offs_ds = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, st_layout))
    s_ptrs = (Out + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + gl.expand_dims(offs_ms, 1) * stride_om
              + gl.expand_dims(offs_ds, 0) * stride_od)
    gl.store(s_ptrs, o_st, mask=gl.expand_dims(offs_ms < N_Q, 1) & gl.expand_dims(offs_ds < D, 0))""")]
EDITS["tma"] = [
    ("_tma_load = tma.async_load if hasattr(tma, \"async_load\") else tma.async_copy_global_to_shared",
     "_tma_load = tma.async_load if hasattr(tma, \"async_load\") else tma.async_copy_global_to_shared\n"
     "_tma_store = tma.async_store if hasattr(tma, \"async_store\") else tma.async_copy_shared_to_global"),
    ("    q_desc, k_desc, v_desc, Q, QS,", "    q_desc, k_desc, v_desc, o_desc, Q, QS,"),
    ("    _epilogue(acc, l_i, r_i, VS, VM, Out, Lse, b, h, v_row0, start_m * BLOCK_M, N_Q, D,",
     "    _epilogue(acc, l_i, r_i, VS, VM, Out, Lse, b, h, v_row0, start_m * BLOCK_M, N_Q, D, o_desc, "
     "k_smem.index(0), pid_bh * N_Q,"),
    ("def _epilogue(acc, l_i, r_i, VS, VM, Out, Lse, b, h, v_row0, row0, N_Q, D,",
     "def _epilogue(acc, l_i, r_i, VS, VM, Out, Lse, b, h, v_row0, row0, N_Q, D, o_desc, o_slot, row_base,"),
    (ST, """    if row0 + BLOCK_M <= N_Q:
        o_smem = o_slot._reinterpret(Out.dtype.element_ty, [BLOCK_M, HEAD_DIM], o_desc.layout)
        o_smem.store(o.to(Out.dtype.element_ty))
        fence_async_shared()
        _tma_store(o_desc, [row_base + row0, 0], o_smem)
        tma.store_wait(0)
    else:
        gl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=o_mask)"""),
    ("    grid = (cdiv(n_q, block_m), out.shape[0] * H)",
     "    o_desc = TensorDescriptor.from_tensor(out.view(-1, d_pad), [block_m, d_pad],\n"
     "                                          gl.NVMMASharedLayout.get_default_for([block_m, d_pad], gl.bfloat16))\n"
     "    grid = (cdiv(n_q, block_m), out.shape[0] * H)"),
    ("        q_desc, k_desc, v_desc, q_arg,", "        q_desc, k_desc, v_desc, o_desc, q_arg,"),
]


def variant(name: str, edits):
    """gluon_attn's source with `edits` applied, loaded as a module of its own (relative imports made absolute)."""
    src = open(gluon_attn.__file__).read().replace("from .", "from sagegen.kernels.")
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), f"gluon_attn_{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"gluon_attn_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def shape_rows(b, h, n, d, gen, mods, rounds=4) -> dict:
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = sagegen.SageConfig()
    block_q, block_k = cfg.blocks(d, torch.cuda.get_device_capability())
    out = torch.empty_like(q)
    qq = triton_quant.quantize(q, k, v, cfg, block_q, block_k, d, None,
                               permute_v_keys=triton_attn.gluon_permutes_v(), quantize_q=False)
    bs = BlockSparse.from_block_dense(random_block_mask(h, n, 0.1, gen), 128, 128)
    n_qt, n_kt = -(-n // block_q), -(-n // block_k)
    tiles = {"d=0.1": kernel_tiles(bs, block_q, block_k, n, n),
             **{f"c={c}": fixed_tiles(b, h, n_qt, n_kt, c, "cuda") for c in (1, 4, 16)}, "dense": None}
    scale = d ** -0.5 * 1.4426950408889634

    def kernel(mod, t):
        return lambda: mod.launch(qq, out, None, None, H=h, group=1, n_q=n, n_k=n, d=d, block_m=block_q,
                                  block_n=block_k, smooth_v=cfg.smooth_v, sm_scale_log2=scale,
                                  permuted_v=triton_attn.gluon_permutes_v(), q=q, tiles=t)
    row = {"shape": [b, h, n, d], "blocks": [block_q, block_k], "copy_q_to_out_ms": time_ms(lambda: out.copy_(q))}
    ref = torch.empty_like(q)
    for name in [m for m in ("base", "cvt", "tma") if m in mods]:  # the store candidates write what the kernel writes
        out.fill_(float("nan"))
        kernel(mods[name], tiles["d=0.1"])()
        if name == "base":
            ref.copy_(out)
        row[f"{name}_equal"] = bool(torch.equal(out, ref))
    for label, t in tiles.items():
        runs = {name: [] for name in mods}
        for _ in range(rounds):
            for name, mod in mods.items():
                runs[name].append(time_ms(kernel(mod, t)))
        row[label] = {name: sorted(ms) for name, ms in runs.items()}
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default=",".join(EDITS), help=f"comma-separated, of {sorted(EDITS)}")
    args = ap.parse_args()
    mods = {"base": gluon_attn, **{name: variant(name, EDITS[name]) for name in args.variants.split(",")}}
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        rows = [shape_rows(*shape, gen, mods) for shape in SHAPES]
    with open(args.out, "w") as f:
        json.dump({"probe": "sparse_ablation", "environment": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
