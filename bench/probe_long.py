"""Long unmasked calls vs the same call with the last key masked (which takes the key-length path), hd128,
B=1, H=24: is 75.6k slower than masked HunyuanVideo-length calls? Prints TFLOP/s.

    python bench/probe_long.py
"""
import os, sys, torch, triton.testing
sys.path.insert(0, ".")
import sagegen
os.environ["SAGEGEN_KERNEL"] = "gluon"
bench = lambda f: triton.testing.do_bench(f, warmup=20, rep=400, return_mode="median")
for n in (32768, 75600, 75648, 75520, 49152):
    q, k, v = (torch.randn(1, 24, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    tf = lambda ms: 4 * 24 * n * n * 128 / ms / 1e9
    m = torch.ones(1, 1, 1, n, dtype=torch.bool, device="cuda"); m[..., -1] = False
    a = tf(bench(lambda: sagegen.sageattn(q, k, v, backend="triton")))
    b = tf(bench(lambda: sagegen.sageattn(q, k, v, backend="triton", attn_mask=m)))
    c = tf(bench(lambda: sagegen.sageattn(q, k, v, backend="triton")))
    print(n, f"unmasked {a:.0f}  last-key-masked {b:.0f}  unmasked {c:.0f}", flush=True)
    q = k = v = None  # free the inputs (not `del`: the lambdas above name them)
