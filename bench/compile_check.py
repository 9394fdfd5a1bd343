"""Compile sagegen's attention kernels (Triton, and the Hopper Gluon one) for sm90 without a GPU and report
registers, spills and the matrix instructions in their SASS (IGMMA/QGMMA/HGMMA on Hopper): costs no device
time.

    python bench/compile_check.py [--head-dim 128] [--sass out.sass]
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from sagegen.config import SageConfig  # noqa: E402
from sagegen.kernels import triton_attn  # noqa: E402

PTR = {"QS": "*fp32", "KS": "*fp32", "VS": "*fp32", "VM": "*fp32", "QB": "*fp32", "MSK": "*fp32",
       "Out": "*bf16", "OS": "*fp32", "Lse": "*fp32", "CNT": "*i32", "IDX": "*i32"}


def compile_attn(head_dim: int, cfg: SageConfig, arch: int = 90, mask_kind: int = 0, causal: bool = False,
                 num_warps: int | None = None, num_stages: int = 2, **extra):
    bq, bk = cfg.blocks(head_dim)
    fn = triton_attn._attn_fwd_kernel
    names = list(inspect.signature(fn.fn).parameters)
    const = dict(BLOCK_M=bq, BLOCK_N=bk, HEAD_DIM=head_dim, CAUSAL=causal,
                 K_PER_TOKEN=cfg.k_granularity == "per_token", MASK_KIND=mask_kind, SMOOTH_Q=cfg.smooth_q,
                 SMOOTH_V=cfg.smooth_v, PV_FP8=cfg.pv_precision == "fp8", RETURN_LSE=False,
                 EXACT_FP8_CAST=False, **{"SPLIT_D": head_dim >= 128, "SPARSE": False, "OUT_FP8": False, **extra})
    chunk = head_dim // 2 if head_dim >= 128 else head_dim
    fp8 = cfg.pv_precision == "fp8"
    desc = {"q_desc": f"tensordesc<i8[{bq}, {head_dim}]>", "k_desc": f"tensordesc<i8[{bk}, {head_dim}]>",
            "v_desc": f"tensordesc<fp8e4nv[{chunk}, {bk}]>" if fp8 else f"tensordesc<fp16[{bk}, {chunk}]>"}
    sig = {}
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n in desc:
            sig[n] = desc[n]
        elif n in PTR:
            sig[n] = PTR[n]
        elif n == "sm_scale_log2":
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    constexprs = {(names.index(k),): v for k, v in const.items()}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    warps = num_warps or triton_attn.launch_settings(bq, bk, head_dim)[0]
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "num_stages": num_stages})


def compile_gluon(head_dim: int, arch: int = 90, smooth_v: bool = True, stages: int | None = None,
                  maxnreg: int | None = None, quant_q: bool | None = None, module=None, extra_const=None,
                  extra_ptr=None):
    """The Hopper Gluon kernel (`gluon_attn`, or a probe copy given as `module` with its added constexprs and
    pointer types) at its launch settings, compiled for `arch` without a GPU."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from sagegen.kernels import gluon_attn as default_module

    gluon_attn = module or default_module

    bq, bk = SageConfig().blocks(head_dim)
    default_stages, default_reg = gluon_attn.launch_settings(head_dim)
    q_l, k_l, v_l = gluon_attn.shared_layouts(bq, bk, head_dim)
    fn = gluon_attn._attn_fwd_sm90
    names = list(inspect.signature(fn.fn).parameters)
    quant_q = gluon_attn.QUANT_Q_IN_KERNEL if quant_q is None else quant_q
    const = dict(BLOCK_M=bq, BLOCK_N=bk, HEAD_DIM=head_dim, STAGES=stages or default_stages, HAS_KV_LEN=False,
                 SMOOTH_V=smooth_v, RETURN_LSE=False, PERMUTED_V=True, QUANT_Q=quant_q, q_layout=q_l,
                 stride_qd=1, stride_od=1,  # unit strides: the JIT's for contiguous tensors
                 **{"SPARSE": False, "PAD_D": False, "OUT_FP8": False, **(extra_const or {})})
    for name, param in inspect.signature(fn.fn).parameters.items():  # constexprs with defaults (EARLY_INDEX, ...):
        if param.default is not inspect.Parameter.empty:  # named here, or the signature would call them i32
            const.setdefault(name, param.default)
    desc = {"q_desc": f"tensordesc<i8[{bq}, {head_dim}],{q_l!r}>",
            "k_desc": f"tensordesc<i8[{bk}, {head_dim}],{k_l!r}>",
            "v_desc": f"tensordesc<fp8e4nv[{head_dim}, {bk}],{v_l!r}>"}
    ptr = {**PTR, "KV_LEN": "*i32", "Q": "*bf16" if quant_q else "*i8", **(extra_ptr or {})}
    sig = {n: "constexpr" if n in const else desc.get(n) or ptr.get(n) or ("fp32" if n == "sm_scale_log2" else "i32")
           for n in names}
    # pointers and row strides divisible by 16, as the JIT finds them for real tensors: vectorized accesses
    aligned = [n for n in names if n in ptr or n in ("stride_qb", "stride_qh", "stride_qm", "stride_ob", "stride_oh",
                                                      "stride_om")]
    src = GluonASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()},
                         attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": 4, "maxnreg": maxnreg or default_reg})


def _cuobjdump(kernel, flag: str) -> str:
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([os.path.join(bin_dir, "cuobjdump"), flag, f.name], capture_output=True,
                              text=True, check=True).stdout


def sass_of(kernel) -> str:
    return _cuobjdump(kernel, "-sass")


def _instructions(sass: str) -> list[tuple[int, str]]:
    return [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.+?);", sass)]


def _loops(instrs: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first, last) address of each loop: a backward branch that comes before the kernel's last EXIT (the
    out-of-line barrier-wait retries placed after it jump back to their wait and are not loops of the kernel's
    own)."""
    exits = [a for a, text in instrs if re.search(r"\bEXIT\b", text)]
    last_exit = max(exits) if exits else float("inf")
    return [(int(m.group(1), 16), a) for a, text in instrs
            if (m := re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)) and int(m.group(1), 16) < a < last_exit]


def loop_spills(sass: str) -> int:
    """LDL/STL instructions inside a loop (`_loops`). A spill there costs every iteration; one outside (a few
    registers parked across the loop and reloaded for the epilogue) costs once a tile."""
    instrs = _instructions(sass)
    loops = _loops(instrs)
    return sum(1 for addr, text in instrs if re.search(r"\b(LDL|STL)\b", text)
               and any(lo <= addr <= hi for lo, hi in loops))


def loop_load_waits(sass: str) -> list[tuple[str, str]]:
    """(load, consumer) pairs in the kernel's longest loop where a global load's result moves to a uniform register
    (R2UR) later in the same iteration: the warp waits there for the load. The block-sparse loop's key-tile
    indices must not (gluon_attn.early_index)."""
    instrs = _instructions(sass)
    loops = _loops(instrs)
    if not loops:
        return []
    lo, hi = max(loops, key=lambda span: span[1] - span[0])
    body = [text for a, text in instrs if lo <= a <= hi]
    waits = []
    for i, text in enumerate(body):
        m = re.match(r"(@!?U?P\w+ )?LDG\S* (R\d+),", text)
        if not m:
            continue
        reg = re.compile(r"\b%s\b" % m.group(2))
        use = next((later for later in body[i + 1:] if reg.search(later)), None)
        if use is not None and "R2UR" in use:
            waits.append((text, use))
    return waits


def summary(kernel) -> dict:
    sass = sass_of(kernel)
    ops = collections.Counter(m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+([A-Z0-9_.]+)", sass))
    res = _cuobjdump(kernel, "-res-usage")
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    return {"registers": int(regs.group(1)) if regs else None, "stack": int(stack.group(1)) if stack else None,
            "shared_bytes": kernel.metadata.shared,
            "matrix_ops": {k: v for k, v in ops.items() if "MMA" in k},
            "mufu": ops.get("MUFU", 0), "ldl/stl": ops.get("LDL", 0) + ops.get("STL", 0),
            "loop_ldl/stl": loop_spills(sass),
            "shfl_idx": len(re.findall(r"SHFL\.IDX", sass)), "ldg128": len(re.findall(r"LDG\.E\.128", sass)),
            "stg128": len(re.findall(r"STG\.E\.128", sass)), "stg": len(re.findall(r"\bSTG\.", sass)),
            "e4m3_cvt": len(re.findall(r"F2FP\.[A-Z0-9_.]*E4M3", sass)),
            "e4m3_satfinite": len(re.findall(r"F2FP\.SATFINITE\.E4M3", sass))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--sass")
    args = ap.parse_args()
    for name, cfg in [("default", SageConfig()), ("fp16-pv", SageConfig(pv_precision="fp16"))]:
        k = compile_attn(args.head_dim, cfg)
        print(name, summary(k))
        if args.sass and name == "default":
            open(args.sass, "w").write(sass_of(k))
    k = compile_gluon(args.head_dim)
    print("gluon (sm90)", summary(k))
    if args.sass:
        open(args.sass + ".gluon", "w").write(sass_of(k))


if __name__ == "__main__":
    main()


def compile_quant(kernel: str, head_dim: int, rotate: bool, arch: int = 90, block: int | None = None):
    """A quantization-pass kernel of `triton_quant` ("q" or "kv"), compiled for `arch` without a GPU, with or
    without the Hadamard rotation (``SageConfig.qk_rotation``), at its launch settings."""
    from sagegen.kernels import triton_quant as tq

    fn = tq._quant_q_kernel if kernel == "q" else tq._quant_kv_kernel
    names = list(inspect.signature(fn.fn).parameters)
    block = block or SageConfig().blocks(head_dim)[0 if kernel == "q" else 1]
    const = dict(BLOCK=block, HEAD_DIM=head_dim, PAD_D=False, ROTATE=rotate, **tq._turn(head_dim))
    const.update(dict(BLOCK_MEAN=False, PER_TOKEN=True) if kernel == "q" else
                 dict(SMOOTH_K=True, SMOOTH_V=True, K_PER_TOKEN=False, FP8=True, EXACT_FP8_CAST=False,
                      KEY_MASK=False, PERMUTE_KEYS=True))
    ptr = {"X": "*bf16", "K": "*bf16", "V": "*bf16", "Y": "*i8", "K8": "*i8", "VQ": "*fp8e4nv"}
    ints = {"H", "N", "D", "N_PAD"}
    sig = {n: "constexpr" if n in const else "i32" if n in ints or n.startswith("stride_") else ptr.get(n, "*fp32")
           for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()})
    warps = tq.QUANT_WARPS["q" if kernel == "q" else "kv"]
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
