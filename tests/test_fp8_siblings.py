"""Projections of one input merged into one GEMM (`sagegen.linear.siblings`): learned from the layers that shared
a quantization in a scope, the same numbers as the separate layers, no memory added (views), and back to
separate GEMMs whenever the pattern breaks (other inputs, more rows than ``merge_max_rows``, a moved model)."""

from __future__ import annotations

import pytest
import torch

import sagegen
from sagegen.linear import FP8Linear, LinearPolicy
from sagegen.linear import siblings
from sagegen.linear.shared import sharing
from sagegen.models import arch as archs


def _layers(n=3, widths=(32, 32, 48), k=64, bias=True, **kw):
    return [FP8Linear(torch.nn.Linear(k, w, bias=bias, dtype=torch.bfloat16), min_rows=1, **kw)
            for w in widths[:n]]


def _counting(monkeypatch):
    """Counts the separate GEMMs (`FP8Linear._gemm`) and the merged ones (`SiblingGroup.gemm`)."""
    counts = {"separate": 0, "merged": 0}
    sep, mer = FP8Linear._gemm, siblings.SiblingGroup.gemm

    def separate(self, *a, **k):
        counts["separate"] += 1
        return sep(self, *a, **k)

    def merged(self, *a, **k):
        counts["merged"] += 1
        return mer(self, *a, **k)

    monkeypatch.setattr(FP8Linear, "_gemm", separate)
    monkeypatch.setattr(siblings.SiblingGroup, "gemm", merged)
    return counts


def _separate(layers, x):
    with torch.no_grad():
        return [f(x) for f in layers]  # outside a scope: each layer alone


@pytest.mark.parametrize("bias", [True, False])
def test_layers_sharing_an_input_learn_one_gemm_with_the_same_outputs(monkeypatch, seed, bias):
    fp8 = _layers(bias=bias)
    x = torch.randn(2, 20, 64, dtype=torch.bfloat16)
    want = _separate(fp8, x)
    sizes = [f.w_q.untyped_storage().nbytes() for f in fp8]
    counts = _counting(monkeypatch)
    with torch.no_grad(), sharing():
        first = [f(x) for f in fp8]          # separate GEMMs; the scope notes that all three took x's copy
    assert counts == {"separate": 3, "merged": 0}
    group = fp8[0].__dict__["_siblings"]
    assert all(f.__dict__["_siblings"] is group for f in fp8)
    # the members' weights are now views of one buffer of the same total size
    assert {f.w_q.untyped_storage().data_ptr() for f in fp8} == {group.w_q.untyped_storage().data_ptr()}
    assert group.w_q.untyped_storage().nbytes() == sum(sizes)
    with torch.no_grad(), sharing():
        got = [f(x) for f in fp8]
    assert counts == {"separate": 3, "merged": 1}
    for g, f1, w in zip(got, first, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0)
        torch.testing.assert_close(f1, w, rtol=0, atol=0)
    assert got[1].stride()[-2] == group.width  # column slices of the one output, not copies


def test_cross_attention_pattern_groups_only_the_layers_that_share(monkeypatch, seed):
    q, k, v = _layers()
    x, ctx = torch.randn(12, 64, dtype=torch.bfloat16), torch.randn(7, 64, dtype=torch.bfloat16)
    counts = _counting(monkeypatch)
    for _ in range(2):
        with torch.no_grad(), sharing():
            out = (q(x), k(ctx), v(ctx))
    assert "_siblings" not in q.__dict__ and k.__dict__["_siblings"] is v.__dict__["_siblings"]
    assert counts == {"separate": 3 + 1, "merged": 1}  # then q alone, k and v as one
    torch.testing.assert_close(list(out), [q(x), k(ctx), v(ctx)], rtol=0, atol=0)


def test_a_group_not_served_whole_is_disbanded_and_stays_correct(monkeypatch, seed):
    fp8 = _layers()
    x, y = torch.randn(9, 64, dtype=torch.bfloat16), torch.randn(9, 64, dtype=torch.bfloat16)
    with torch.no_grad(), sharing():
        [f(x) for f in fp8]
    assert "_siblings" in fp8[0].__dict__
    with torch.no_grad(), sharing():
        a = fp8[0](x)   # the group's GEMM of x ...
        b = fp8[1](y)   # ... but the next member wants another input: x's GEMM was not taken by all
    assert not any("_siblings" in f.__dict__ for f in fp8)
    torch.testing.assert_close([a, b], [fp8[0](x), fp8[1](y)], rtol=0, atol=0)


def test_no_merge_above_the_row_limit_or_when_off_or_for_special_layers(monkeypatch, seed):
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    limited = _layers(merge_max_rows=32)
    off = _layers(merge_max_rows=0)
    gelu = _layers()
    gelu[1].prologue = "gelu_tanh"
    counts = _counting(monkeypatch)
    for _ in range(2):
        for layers in (limited, off, gelu):
            with torch.no_grad(), sharing():
                [f(x) for f in layers]
    assert counts["merged"] == 1                       # only gelu[0] with gelu[2], in the second round
    assert "_siblings" in limited[0].__dict__          # learned, but 40 rows > 32: separate GEMMs
    assert not any("_siblings" in f.__dict__ for f in off)
    assert "_siblings" not in gelu[1].__dict__ and gelu[0].__dict__["_siblings"] is gelu[2].__dict__["_siblings"]
    with pytest.raises(ValueError, match="merge_max_rows"):
        LinearPolicy(merge_max_rows=-1)
    with pytest.raises(ValueError, match="merge_max_rows"):
        LinearPolicy(merge_max_rows=True)


def test_moving_the_model_disbands_groups(seed):
    fp8 = _layers()
    model = torch.nn.ModuleList(fp8)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    with torch.no_grad(), sharing():
        [f(x) for f in fp8]
    want = _separate(fp8, x)
    model.to("cpu")
    assert not any("_siblings" in f.__dict__ for f in fp8)
    torch.testing.assert_close(_separate(fp8, x), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["flux.1-dev", "wan2.1-t2v-1.3b"])
def test_patched_model_merges_its_projections_with_the_same_output(name):
    """A tiny model's steps with FP8 linears everywhere (emulation): the second step runs the merged GEMMs that
    the first one learned (Flux's single blocks: Q, K, V and proj_mlp), with the output of merging off;
    `patch_info` lists the groups; unpatch restores the model exactly."""
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cpu", seed=1, height=64, width=64)
    with torch.inference_mode():
        stock = model(**inputs)[0]
    outs = {}
    for rows in (0, 16384):
        sagegen.patch(model, backend="reference", linear="fp8",
                      linear_policy=LinearPolicy(keep_blocks=(), min_rows=1, merge_max_rows=rows))
        with torch.inference_mode():
            model(**inputs)
            outs[rows] = model(**inputs)[0]
        groups = sagegen.patch_info(model)["linear"]["merged_projections"]
        sagegen.unpatch(model)
        if rows == 0:
            assert groups == []
    torch.testing.assert_close(outs[16384], outs[0], rtol=0, atol=0)
    assert groups and all(len(g) >= 2 for g in groups)
    if name == "flux.1-dev":
        assert any(len(g) == 4 and any(n.endswith("proj_mlp") for n in g) for g in groups), groups
    assert any(all(n.rsplit(".", 1)[-1] in ("to_q", "to_k", "to_v") for n in g) and len(g) == 3 for g in groups)
    with torch.inference_mode():
        torch.testing.assert_close(model(**inputs)[0], stock, rtol=0, atol=0)
