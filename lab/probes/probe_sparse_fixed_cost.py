"""Where a low-density block-sparse call spends its time (issue 20's FlexAttention ratio at density 0.1).

Per shape: the full sparse call at d = 0.1 (random 128 x 128 blocks, diagonal kept, as bench_sparse.py), its
parts (the K/V quantization pass, the tile conversion, the Hopper kernel alone on prepared buffers), the kernel
with every q-tile given exactly c key tiles (c = 1, 2, 4, 8, 16, 32: the fixed cost per CTA is the intercept)
and the kernel under other launch settings (ring slots, register cap). FlexAttention (compiled, same blocks) on
the first shape. JSON to --out.

    python lab/probes/probe_sparse_fixed_cost.py --out $OUT/probe-sparse-fixed.json

``--base DIR`` (a directory holding an older package as ``sagegen_base/``, as `ab_versions.py` makes it): also
times that copy's Hopper kernel on the same buffers, alternating base / new four times, at d = 0.1, dense and
c = 1 / 4 / 16 (`ab` in the row).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import sagegen  # noqa: E402
from bench_sparse import environment, flex_mask, random_block_mask, time_ms  # noqa: E402
from sagegen import BlockSparse  # noqa: E402
from sagegen.kernels import gluon_attn, triton_attn, triton_quant  # noqa: E402
from sagegen.kernels.block_sparse import kernel_tiles  # noqa: E402

SHAPES = [(2, 48, 17776, 64), (1, 24, 32768, 128)]
SETTINGS = {64: [(4, 168), (3, 168), (2, 168), (4, None)], 128: [(3, None), (2, None), (2, 168)]}
COUNTS = (1, 2, 4, 8, 16, 32)


def fixed_tiles(b, h, n_qt, n_kt, c, device):
    """Every q-tile lists c key tiles spread over the row (sorted, distinct)."""
    idx = torch.zeros(b, h, n_qt, n_kt, dtype=torch.int32, device=device)
    cols = (torch.arange(c, device=device) * (n_kt // c)).to(torch.int32)
    idx[..., :c] = cols
    return torch.full((b, h, n_qt), c, dtype=torch.int32, device=device), idx


def quantized_inputs(b, h, n, d):
    """Random bf16 Q/K/V [b, h, n, d] on the GPU and what the Hopper kernel alone needs: (q, cfg, block_q,
    block_k, out, qq), with qq from the K/V pass as the full call runs it (Q left to the kernel)."""
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = sagegen.SageConfig()
    block_q, block_k = cfg.blocks(d, torch.cuda.get_device_capability())
    qq = triton_quant.quantize(q, k, v, cfg, block_q, block_k, d, None,
                               permute_v_keys=triton_attn.gluon_permutes_v(), quantize_q=False)
    return q, cfg, block_q, block_k, torch.empty_like(q), qq


def ab_rows(launches: dict, base_gluon, rounds: int = 4) -> dict:
    """{label: {"base": [ms...], "new": [ms...]}}: each launch of both kernels timed in turn, `rounds` times."""
    out = {}
    for label, make in launches.items():
        runs = {"base": [], "new": []}
        for _ in range(rounds):
            for name, mod in (("base", base_gluon), ("new", gluon_attn)):
                runs[name].append(time_ms(make(mod)))
        out[label] = {**runs, "new_over_base": sorted(n / b for n, b in zip(runs["new"], runs["base"]))}
    return out


def shape_rows(b, h, n, d, gen, flex, base_gluon=None) -> dict:
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = sagegen.SageConfig()
    block_q, block_k = cfg.blocks(d, torch.cuda.get_device_capability())
    out = torch.empty_like(q)
    row = {"shape": [b, h, n, d], "blocks": [block_q, block_k]}
    row["dense_ms"] = time_ms(lambda: sagegen.sageattn(q, k, v, backend="triton"))
    blocks = random_block_mask(h, n, 0.1, gen)
    row["density"] = blocks.float().mean().item()
    bs = BlockSparse.from_block_dense(blocks, 128, 128)
    row["sparse_ms"] = time_ms(lambda: sagegen.sageattn(q, k, v, backend="triton", block_mask=bs))
    quant = lambda: triton_quant.quantize(q, k, v, cfg, block_q, block_k, d, None,  # noqa: E731
                                          permute_v_keys=triton_attn.gluon_permutes_v(), quantize_q=False)
    row["kv_quant_ms"] = time_ms(quant)
    row["tiles_ms"] = time_ms(lambda: kernel_tiles(bs, block_q, block_k, n, n))
    qq = quant()
    tiles = kernel_tiles(bs, block_q, block_k, n, n)
    c = d ** -0.5 * 1.4426950408889634  # sm_scale * log2(e)

    def kernel(t, mod=gluon_attn):
        return lambda: mod.launch(qq, out, None, None, H=h, group=1, n_q=n, n_k=n, d=d, block_m=block_q,
                                  block_n=block_k, smooth_v=cfg.smooth_v, sm_scale_log2=c,
                                  permuted_v=triton_attn.gluon_permutes_v(), q=q, tiles=t)
    row["kernel_ms"] = time_ms(kernel(tiles))
    row["kernel_dense_ms"] = time_ms(kernel(None))
    n_qt, n_kt = -(-n // block_q), -(-n // block_k)
    if base_gluon is not None:
        fixed = {c_: fixed_tiles(b, h, n_qt, n_kt, c_, "cuda") for c_ in (1, 4, 16)}
        launches = {"d=0.1": lambda mod: kernel(tiles, mod), "dense": lambda mod: kernel(None, mod),
                    **{f"c={c_}": (lambda mod, t=t: kernel(t, mod)) for c_, t in fixed.items()}}
        row["ab"] = ab_rows(launches, base_gluon)
    row["kernel_fixed_count_ms"] = {c_: time_ms(kernel(fixed_tiles(b, h, n_qt, n_kt, c_, "cuda"))) for c_ in COUNTS}
    row["settings"] = {}
    for stages, reg in SETTINGS[d]:
        gluon_attn.LAUNCH_OVERRIDES[d] = (stages, reg)
        try:
            row["settings"][f"{stages},{reg}"] = {"kernel_ms": time_ms(kernel(tiles)),
                                                  "kernel_dense_ms": time_ms(kernel(None))}
        except Exception as e:  # noqa: BLE001 - a setting that does not fit is a result too
            row["settings"][f"{stages},{reg}"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        finally:
            gluon_attn.LAUNCH_OVERRIDES.pop(d, None)
    if flex is not None:
        bm = flex_mask(blocks, n)
        row["flex_ms"] = time_ms(lambda: flex(q, k, v, block_mask=bm))
        row["flex_over_sparse"] = row["flex_ms"] / row["sparse_ms"]
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--base", help="a directory holding an older package as sagegen_base/ (A/B of the kernel)")
    args = ap.parse_args()
    base_gluon = None
    if args.base:
        import importlib

        sys.path.insert(0, args.base)
        base_gluon = importlib.import_module("sagegen_base.kernels.gluon_attn")
    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    with torch.inference_mode():
        for i, shape in enumerate(SHAPES):
            rows.append(shape_rows(*shape, gen, flex if i == 0 else None, base_gluon))
    with open(args.out, "w") as f:
        json.dump({"probe": "sparse_fixed_cost", "environment": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
