"""Key-padding masks in the Gluon kernel's form (sagegen/kernels/key_padding.py): valid prefixes become
per-batch lengths; other padding is moved behind the valid keys, which must leave attention unchanged."""

import pytest
import torch

from tests.support.helpers import qkv, rel_l1
from sagegen import SageConfig
from sagegen.kernels.key_padding import compact_valid_keys, key_prefix_lengths
from sagegen.kernels.reference import attention_fp64, sage_attention
from sagegen.kernels.spec import MaskSpec

INF = float("-inf")


def test_key_prefix_lengths():
    """Key-padding masks that only cut the end of the keys become per-batch lengths; anything else is None."""
    bias = torch.zeros(3, 6)
    bias[0, 4:] = INF
    bias[2, 1:] = INF
    assert key_prefix_lengths(bias).tolist() == [4, 6, 1]
    hole = bias.clone()
    hole[1, 2] = INF  # a masked key before a live one
    assert key_prefix_lengths(hole) is None
    soft = bias.clone()
    soft[1, 0] = -2.0  # a finite bias is not padding
    assert key_prefix_lengths(soft) is None
    empty = bias.clone()
    empty[2, 0] = INF  # a batch with no live key
    assert key_prefix_lengths(empty) is None


def ulysses_like_bias(b: int, n_video: int, n_text: int, valid: list[int]) -> torch.Tensor:
    """HunyuanVideo's key mask as Ulysses 2 gathers it: [video 0, text 0, video 1, text 1], each text chunk
    a slice of one valid-prefix text mask, so padding sits in the middle of the keys."""
    bias = torch.zeros(b, 2 * (n_video + n_text))
    half = n_text
    for i, n in enumerate(valid):
        text = torch.where(torch.arange(2 * half) < n, 0.0, INF)
        bias[i, n_video:n_video + half] = text[:half]
        bias[i, 2 * n_video + half:] = text[half:]
    return bias


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("hkv", [4, 2])
def test_compaction_leaves_attention_unchanged(seed, layout, hkv):
    """fp64 attention (output and LSE) over the compacted keys equals attention over the original ones; the
    valid keys keep their order; padded keys (garbage here) do not survive; lengths per batch."""
    b, h, nq, d = 3, 4, 37, 16
    bias = ulysses_like_bias(b, n_video=21, n_text=9, valid=[5, 12, 18])
    q, k, v = qkv(b, h, hkv, nq, bias.shape[1], d, dtype=torch.float32, layout=layout)
    k, v = (t.transpose(1, 2) if layout == "NHD" else t for t in (k, v))   # [B, H, N, D] views
    q = q.transpose(1, 2) if layout == "NHD" else q
    live = bias > INF
    k = k.masked_fill(~live[:, None, :, None], 1e4)    # padding holds garbage
    kc, vc, bc, n = compact_valid_keys(k, v, bias)
    assert n.tolist() == live.sum(1).tolist() and kc.shape[2] == max(n.tolist()) and kc.is_contiguous()
    for i in range(b):
        idx = live[i].nonzero()[:, 0]
        assert torch.equal(kc[i, :, :n[i]], k[i][:, idx]) and torch.equal(vc[i, :, :n[i]], v[i][:, idx])
        assert (bc[i, :n[i]] == 0).all() and (bc[i, n[i]:] == INF).all()
    assert key_prefix_lengths(bc).tolist() == n.tolist()
    o1, l1 = attention_fp64(q, k, v, sm_scale=d ** -0.5, mask=MaskSpec("key", bias))
    o2, l2 = attention_fp64(q, kc, vc, sm_scale=d ** -0.5, mask=MaskSpec("key", bc))
    torch.testing.assert_close(o2, o1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(l2, l1, rtol=1e-12, atol=1e-12)


def test_compaction_refuses_what_is_not_padding():
    k = v = torch.randn(2, 2, 8, 16)
    soft = torch.zeros(2, 8)
    soft[0, 3] = -1.5                  # an additive bias: the Triton kernel applies it
    assert compact_valid_keys(k, v, soft) is None
    empty = torch.zeros(2, 8)
    empty[1] = INF                     # a batch with no key: its rows must be zeros, the Triton kernel's job
    assert compact_valid_keys(k, v, empty) is None


def test_compacted_emulation_keeps_its_accuracy(seed):
    """The quantized emulation over compacted keys (different keys share a block, so scales differ) stays as
    close to exact attention as over the original order."""
    b, h, nq, d = 2, 4, 300, 64
    bias = ulysses_like_bias(b, n_video=200, n_text=64, valid=[40, 100])
    q, k, v = qkv(b, h, h, nq, bias.shape[1], d, dtype=torch.bfloat16)
    cfg = SageConfig()
    ref, _ = attention_fp64(q, k, v, sm_scale=d ** -0.5, mask=MaskSpec("key", bias))
    orig, _ = sage_attention(q, k, v, sm_scale=d ** -0.5, mask=MaskSpec("key", bias), config=cfg)
    kc, vc, bc, _ = compact_valid_keys(k, v, bias)
    comp, _ = sage_attention(q, kc, vc, sm_scale=d ** -0.5, mask=MaskSpec("key", bc), config=cfg)
    e_orig, e_comp = rel_l1(orig, ref), rel_l1(comp, ref)
    assert e_comp < 0.05 and abs(e_comp - e_orig) < 0.03 * e_orig, (e_orig, e_comp)   # measured <= 0.3% over 40 seeds
