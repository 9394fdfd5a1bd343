"""Block-sparse policy on the GPU (skipped without CUDA): the pooled-statistics launch against its PyTorch
twin, the predictor's mask through the Triton kernel against the emulation, the mass kept on video-like inputs
at a real size, and fullgraph compile of sageattn(sparse=...)."""

import pytest
import torch

import sagegen
from tests.conftest import gpu
from sagegen import SparseConfig
from sagegen.sparse import pool, predictor
from sagegen.testing import attention_inputs as synthetic

pytestmark = gpu


@pytest.mark.parametrize("d", [64, 128])
def test_pool_launch_matches_torch_on_gpu(seed, d):
    x = torch.randn(2, 8, 5000, d, device="cuda", dtype=torch.bfloat16) + 2
    c = pool.center(x)
    m1, s1 = pool.pool_blocks(x, 64, c)
    m2, s2 = pool.pool_blocks_torch(x, 64, c)
    torch.testing.assert_close(m1, m2, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s1, s2, atol=1e-4, rtol=1e-4)


# top-k 0.3 keeps >= 99% of the mass at 8k tokens; the cdf rule, judged on pooled scores, keeps 97.8% at 0.99
# (H100, 2026-11-24): the pooled softmax is flatter than the real one, so cdf undershoots its own target
@pytest.mark.parametrize("mode,value,min_mass", [("topk", 0.3, 0.99), ("cdf", 0.99, 0.97)])
def test_predicted_mask_kernel_vs_emulation_and_mass(mode, value, min_mass):
    g = torch.Generator().manual_seed(7)
    q, k, v = (t.cuda() for t in synthetic.video_qkv(8, 32, 32, heads=4, head_dim=128, generator=g))
    cfg = SparseConfig(mode=mode, value=value)
    out = sagegen.sageattn(q, k, v, sparse=cfg, backend="triton")
    ref = sagegen.sageattn(q, k, v, sparse=cfg, backend="reference")
    assert float((out.float() - ref.float()).norm() / ref.float().norm()) < 0.02
    keep = predictor.predict_keep(q, k, cfg, sm_scale=128 ** -0.5, block_q=64, block_kv=128)
    mass = synthetic.kept_mass(synthetic.attention_probs(q[:, :1], k[:, :1], 128 ** -0.5), keep[:, :1], 64, 128)
    print(f"{mode}={value}: density {keep.float().mean():.3f} mass mean {mass.mean():.4f} min {mass.min():.4f}")
    assert mass.mean() >= min_mass


def test_sparse_compiles_fullgraph_on_gpu(seed):
    q, k, v = (torch.randn(1, 8, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = SparseConfig(mode="topk", value=0.5)
    fn = torch.compile(lambda a, b, c: sagegen.sageattn(a, b, c, sparse=cfg, backend="triton"), fullgraph=True)
    torch.testing.assert_close(fn(q, k, v), sagegen.sageattn(q, k, v, sparse=cfg, backend="triton"))
