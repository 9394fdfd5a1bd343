"""One-off: does the norm kernel's FP8 variant (`residual_norm(fp8=True)`) compute the normalised rows bit for
bit as the plain one, at the models' widths? Compares the committed kernel with a copy given by path (an older
version of `triton_residual_norm.py`), and times both variants of each.

    python bench/probes/probe_norm_fp8_identity.py --other /tmp/rn_v1.py --out $OUT/probe-norm-fp8.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from probe_util import environment, module_from_source, write_json  # noqa: E402

from sagegen.kernels import triton_residual_norm as current  # noqa: E402


def main():
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    src = open(args.other).read().replace("from .", "from sagegen.kernels.")
    other = module_from_source(src, "residual_norm_other")
    rows = []
    for C, S in ((1536, 32760), (2432, 8858), (3072, 4608), (5120, 75600)):
        x, y = (torch.randn(1, S, C, device="cuda") * 3).bfloat16(), torch.randn(1, S, C, device="cuda").bfloat16()
        gate, scale, shift = (torch.randn(1, 1, C, device="cuda") * 0.3 for _ in range(3))
        kw = dict(scale=scale, shift=shift)
        row = {"C": C, "S": S}
        for tag, mod in (("current", current), ("other", other)):
            h0, n0 = mod.residual_norm(x, y, gate, **kw)
            h, n, (q, s) = mod.residual_norm(x, y, gate, fp8=True, **kw)
            from sagegen.kernels.fp8_quant import quantize_fp8_rows
            qr, sr = quantize_fp8_rows(n.reshape(-1, C))
            row[tag] = {"n_identical": bool(torch.equal(n, n0)), "n_elements_differing": int((n != n0).sum()),
                        "h_identical": bool(torch.equal(h, h0)),
                        "q_equals_quantizer_of_n": bool(torch.equal(q.view(torch.uint8), qr.view(torch.uint8))
                                                        and torch.equal(s, sr)),
                        "ms_plain": triton.testing.do_bench(lambda: mod.residual_norm(x, y, gate, **kw)),
                        "ms_fp8": triton.testing.do_bench(lambda: mod.residual_norm(x, y, gate, fp8=True, **kw)),
                        "ms_quantizer": triton.testing.do_bench(lambda: quantize_fp8_rows(n0.reshape(-1, C)))}
        rows.append(row)
        print(row, flush=True)
    write_json(args.out, environment=environment(), rows=rows)


if __name__ == "__main__":
    main()
