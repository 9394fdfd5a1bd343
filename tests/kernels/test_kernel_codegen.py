"""The attention kernel compiles for every GPU generation it claims, without a GPU (ptxas + cuobjdump ship
with Triton): the right matrix instructions, no register spills. Speed itself is judged on the GPU.

Compiled in a subprocess: the test session runs Triton's interpreter (TRITON_INTERPRET=1), which has no
compiler behind the kernels.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = """
import json, sys
sys.path.insert(0, "bench")
from compile_check import compile_attn, summary
from sagegen.config import SageConfig
from sagegen.kernels import triton_attn
arch, d, fields = json.loads(sys.argv[1])
cfg = SageConfig(**fields)
cap = (arch // 10, arch % 10)
bq, bk = cfg.blocks(d, cap)
warps, stages, *_ = triton_attn.launch_settings(bq, bk, d, cap)
kernel = compile_attn(d, cfg.replace(block_q=bq, block_k=bk), arch=arch, num_warps=warps, num_stages=stages)
print(json.dumps(summary(kernel)))
"""

def _no_costly_spills(report: dict) -> bool:
    """No local-memory access inside a loop, and at most a few registers parked across it (Triton 3.9 keeps
    16 bytes of the head-dim-64 Gluon kernel's state in local memory before its loop and reloads it for the
    epilogue: once a tile)."""
    return report["loop_ldl/stl"] == 0 and report["stack"] <= 32


def test_loop_spills_counts_only_local_memory_inside_loops():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from compile_check import loop_spills

    def sass(*lines):
        return "\n".join(f"        /*{i * 16:04x}*/                   {text} ;" for i, text in enumerate(lines))

    body = ["MOV R1, R2", "STL [R1], R3", "IMAD R4, R4, R5, RZ", "LDL.LU R5, [R1+0x4]"]
    assert loop_spills(sass("MOV R0, R1", *body, "@P4 BRA 0x0010", "EXIT", "BRA 0x0010")) == 2  # loop 0x10-0x50
    assert loop_spills(sass("STL [R1], R3", "MOV R0, R1", "IMAD R2, R2, R3, RZ", "@P4 BRA 0x0010",
                            "LDL.LU R5, [R1+0x4]", "EXIT")) == 0  # parked before the loop, reloaded after it
    # an out-of-line wait retry after EXIT jumping back is no loop of the kernel's
    assert loop_spills(sass("MOV R0, R1", "STL [R1], R3", "LDL R5, [R1]", "EXIT", "@!P4 BRA 0x0050",
                            "BRA 0x0010")) == 0


def _triton_before(major: int, minor: int) -> bool:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2]) < (major, minor)


# Triton 3.6 allocates the sm89 head-dim-128 kernel at 255 registers and spills (368 bytes of stack; every block
# size and stage count tried spills too, checked offline on 2026-11-29); Triton 3.8 and later do not (186
# registers). Strict: a Triton 3.6 that stops spilling makes this fail, so the note gets revisited.
_T36_SM89 = pytest.mark.xfail(_triton_before(3, 7), strict=True,
                              reason="Triton 3.6 spills the sm89 head-dim-128 kernel (lab/NOTES.md v7.6)")
CASES = [  # arch, head dim, SageConfig fields, matrix instructions expected in the SASS
    (90, 128, {}, {"IGMMA", "QGMMA"}),
    (90, 64, {"smooth_v": True}, {"IGMMA", "QGMMA"}),
    pytest.param(89, 128, {}, {"IMMA", "QMMA"}, marks=_T36_SM89),
    (80, 64, {"pv_precision": "fp16"}, {"IMMA", "HMMA"}),
]


@pytest.mark.parametrize("arch, d, fields, ops", CASES, ids=["sm90-d128", "sm90-d64", "sm89-d128", "sm80-d64"])
def test_kernel_compiles_without_spills(arch, d, fields, ops):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([arch, d, fields])], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert _no_costly_spills(report), report
    assert ops <= set(report["matrix_ops"]), report


GLUON_SCRIPT = """
import json, sys
sys.path.insert(0, "bench")
from compile_check import compile_gluon, summary
fp8 = sys.argv[2] == "fp8"
kernel = compile_gluon(int(sys.argv[1]), extra_const={"OUT_FP8": fp8}, extra_ptr={"Out": "*fp8e4nv"} if fp8 else None)
print(json.dumps(summary(kernel)))
"""


@pytest.mark.parametrize("out", ["bf16", "fp8"])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_kernel_compiles_for_hopper(d, out):
    """sm90 Gluon kernel: IGMMA and QGMMA, no spills in its loop at its register cap, P reaches the FP8 multiply
    without a shuffle (V's keys are stored in the accumulator's order), Q is loaded and O stored 16 bytes at a
    time; every conversion to e4m3 saturates (P's, and the FP8 output's, which relies on it: kernels/fp8_out.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", GLUON_SCRIPT, str(d), out], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert _no_costly_spills(report), report
    assert {"IGMMA", "QGMMA"} <= set(report["matrix_ops"]), report
    assert report["shfl_idx"] == 0, report
    assert report["ldg128"] >= 1, report  # Q, quantized in the kernel, is read with 16-byte loads
    # O: 64 x d bf16 (or e4m3), 16 bytes a thread a store
    assert report["stg128"] == report["stg"] == (d // 16 if out == "bf16" else d // 32), report
    assert report["e4m3_cvt"] == report["e4m3_satfinite"] > 0, report


SPARSE_SCRIPT = """
import json, sys
sys.path.insert(0, "bench")
from compile_check import compile_gluon, loop_load_waits, sass_of
from sagegen.kernels import gluon_attn
out = {}
for early in (True, False):
    kernel = compile_gluon(128, extra_const={"SPARSE": True, "EARLY_INDEX": early},
                           extra_ptr={"CNT": "*i32", "IDX": "*i32"})
    out[str(early)] = len(loop_load_waits(sass_of(kernel)))
out["chosen"] = gluon_attn.early_index(128)
print(json.dumps(out))
"""


def test_loop_load_waits_finds_an_index_moved_to_a_uniform_register_in_its_iteration():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from compile_check import loop_load_waits

    def sass(*lines):
        return "\n".join(f"        /*{i * 16:04x}*/                   {text} ;" for i, text in enumerate(lines))

    waits = loop_load_waits(sass("MOV R0, R1", "@!P3 LDG.E R24, desc[UR50][R24.64]", "FADD R3, R3, R4",
                                 "@!P3 R2UR UR57, R24", "@P4 BRA 0x0010", "EXIT"))
    assert len(waits) == 1 and "R2UR" in waits[0][1]
    # carried to the next iteration (first read by a move at the loop's end): no wait
    assert loop_load_waits(sass("MOV R0, R1", "@!P3 LDG.E R24, desc[UR50][R24.64]", "FADD R3, R3, R4",
                                "IMAD.MOV.U32 R231, RZ, RZ, R24", "@P4 BRA 0x0010", "EXIT")) == []


@pytest.mark.skipif(_triton_before(3, 8),
                    reason="gluon_attn.early_index is off before Triton 3.8 (3.6's loop carries the indices itself)")
def test_block_sparse_loop_does_not_wait_on_its_index_loads():
    """Head dim 128, block-sparse: with the launch's EARLY_INDEX the loop's key-tile indices are never moved to a
    uniform register in the iteration that loads them (Triton 3.8/3.9 did so without it, and the sparse loop ran
    6-8% slower than the dense one on an H200: lab/NOTES.md v8.2)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SPARSE_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["chosen"] is True, report
    assert report["True"] == 0 and report["False"] >= 1, report


LIST_SCRIPT = """
import json, sys
sys.path.insert(0, "bench")
from compile_check import compile_gluon, loop_load_waits, sass_of
from sagegen.kernels import gluon_attn
out = {"limit": gluon_attn.LIST_LIMIT[64], "chosen": gluon_attn.list_in_smem(64, 139)}
for staged in (True, False):
    kernel = compile_gluon(64, extra_const={"SPARSE": True, "LIST_IN_SMEM": staged, "MAX_TILES": out["limit"]},
                           extra_ptr={"CNT": "*i32", "IDX": "*i32"})
    out[str(staged)] = {"waits": len(loop_load_waits(sass_of(kernel))), "shared": kernel.metadata.shared}
print(json.dumps(out))
"""


def test_block_sparse_loop_at_head_dim_64_reads_its_list_from_shared_memory():
    """Head dim 64, block-sparse: at the launch's register cap every Triton version moved the loaded key-tile
    indices and K scales to uniform registers in the iteration that loads them (three waits on global loads a
    key tile). Staged in shared memory (gluon_attn.list_in_smem) the loop has none, and at the longest list
    it stages three CTAs still fit an SM (228 KiB, 1 KiB reserved a CTA)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", LIST_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["chosen"] == 256, report  # CogVideoX-5b's 139 key tiles
    assert report["True"]["waits"] == 0 and report["False"]["waits"] >= 1, report
    assert 3 * (report["True"]["shared"] + 1024) <= 228 * 1024, report


QUANT_SCRIPT = """
import json, sys
sys.path.insert(0, "bench")
from compile_check import compile_quant, summary
print(json.dumps(summary(compile_quant(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"))))
"""


@pytest.mark.parametrize("kernel", ["q", "kv"])
@pytest.mark.parametrize("d", [64, 128])
def test_the_rotated_quantization_pass_compiles_for_hopper_without_new_spills(kernel, d):
    """`SageConfig.qk_rotation="hadamard"`: the Walsh-Hadamard butterflies (reshape / permute / split / join in
    registers) compile for sm90 with the real backend, not only in the interpreter, and add no spills of note. The
    Q pass spills nothing either way; the K/V pass at its 128-key tile already spills without the rotation (8 /
    240 bytes of stack at head dim 64 / 128 with the locked Triton 3.8, 2026-12-08), and the rotation keeps it
    within 32 bytes of that (24 / 192)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    reports = {}
    for rotate in ("0", "1"):
        done = subprocess.run([sys.executable, "-c", QUANT_SCRIPT, kernel, str(d), rotate], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        reports[rotate] = json.loads(done.stdout.strip().splitlines()[-1])
    if kernel == "q":
        assert reports["1"]["ldl/stl"] == 0 and reports["1"]["stack"] == 0, reports
    else:
        assert reports["1"]["stack"] <= reports["0"]["stack"] + 32, reports
