"""sagegen's context-parallel attention on 2-4 CPU processes (gloo), against single-process sagegen and
exact fp64 attention, with every mask form diffusers' models hand the backend (cases: tests/support/cp.py).

Ulysses computes each head over the whole sequence, as one process does: identical output. Ring quantizes
each KV chunk on its own (K smoothing and V scales per chunk), so it differs from one process by about
sagegen's own quantization error, and its error against exact attention stays the same size."""

import math

import pytest
import torch

from tests.support import cp as cp_support
from sagegen.parallel.collective import _RingMerge


def _check_ulysses(res):
    res.pop("local_calls", None)
    for name, r in res.items():
        assert r["nan"] == 0, name
        # same per-head computation as one process: identical up to a bf16 rounding at most
        assert r["max_abs_vs_single"] <= 4e-3, (name, r)
        assert r["lse_inf_match"], (name, r)
        assert r["lse_max_abs"] <= 1e-4, (name, r)


def _check_ring(res):
    res.pop("local_calls", None)
    for name, r in res.items():
        e = r["rel_l1_single_vs_exact"]
        assert r["nan"] == 0, (name, r)
        assert r["lse_inf_match"], (name, r)                  # rows masked everywhere stay -inf, no others
        assert r["rel_l1_cp_vs_exact"] <= 1.2 * e, (name, r)  # as accurate as one process
        assert r["rel_l1_vs_single"] <= 1.6 * e, (name, r)    # two independent quantizations of one result
        assert r["lse_max_abs"] <= 0.1, (name, r)


@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_segments_keep_one_process_order(tmp_path, seed, ulysses, ring):
    """``segments`` (a joint call's (video, text) lengths on every rank): under Ulysses each rank attends in one
    process's order ([all video, all text]), so the output is bit-identical to one process -- with text padding
    that sits in the middle of the ranks' chunk order, per-head and per-query masks too. Ring ignores them
    (each KV chunk is attended on its own) and stays as accurate as one process."""
    res = cp_support.run_segments(tmp_path, ulysses=ulysses, ring=ring, seed=seed)
    assert "segments (1, 2) must be lengths >= 0 that add up to the local sequence" in res.pop("bad_segments_error")
    res.pop("local_calls")
    for name, r in res.items():
        assert r["nan"] == 0, (name, r)
        if ring == 1:
            assert r["equal"], (name, r)
        else:
            assert r["rel_l1_cp_vs_exact"] <= 1.2 * r["rel_l1_single_vs_exact"], (name, r)


@pytest.mark.parametrize("ulysses,ring,part_calls", [(1, 2, True), (1, 2, False),
                                                     pytest.param(2, 2, True, marks=pytest.mark.slow)])
def test_ring_in_order_attends_each_segment_over_one_process_keys(tmp_path, seed, ulysses, ring, part_calls):
    """``ring_in_order`` (what sagegen's backend asks for joint calls under Ring): the gathered keys in one
    process's order; with ``ring_part_calls`` (block-sparse calls) a call per segment, its queries placed where
    one process has them and routed as the rank's whole call (``call_rows``), else one call over the rank's
    rows. The output and LSE equal one process's bit for bit either way (Q is quantized per token, K per block
    of one process's order), every mask case included."""
    world = ulysses * ring
    a, b = 40, 8
    res = cp_support.run_segments(tmp_path, ulysses=ulysses, ring=ring, seed=seed, s=world * (a + b),
                                  segments=(a, b), in_order=True, part_calls=part_calls)
    res.pop("bad_segments_error")
    for g, seen in enumerate(res.pop("local_calls")):
        rr = g // ulysses  # ring rank: its Ulysses group holds U chunks' video, then their text
        rows = ulysses * (a + b)
        want = ([(rr * ulysses * a, ulysses * a, True, rows), (world * a + rr * ulysses * b, ulysses * b, True, rows)]
                if part_calls else [(None, rows, True, None)])
        assert seen == [list(c) for c in want], (g, seen)
    for name, r in res.items():
        assert r["nan"] == 0 and r["equal"] and r["lse_equal"], (name, r["lse_max_diff"], r)


def test_ulysses_2(tmp_path, seed):
    _check_ulysses(cp_support.run_topology(tmp_path, ulysses=2, ring=1, seed=seed))


def _local_calls(res, ulysses: int, ring: int, one_call: bool, s: int = 96) -> None:
    """What each rank's local attention got: (q_offset, keys). Ring per chunk: no offset, a chunk of U local
    chunks; one call: every key, the queries at ring super-chunk ring_rank (global rank g = ring_rank * U + u)."""
    sl = s // (ulysses * ring)
    for g, seen in enumerate(res.pop("local_calls")):
        assert seen == ([[(g // ulysses) * ulysses * sl, s]] if one_call else [[None, ulysses * sl]]), (g, seen)


def test_ring_3_fully_masked_chunk(tmp_path, seed):
    # the "keypad" and "additive" cases mask the whole last chunk of batch 0 at 3 ranks (defect c)
    res = cp_support.run_topology(tmp_path, ulysses=1, ring=3, seed=seed)
    _local_calls(res, 1, 3, one_call=False)
    _check_ring(res)


@pytest.mark.parametrize("ulysses,ring", [(1, 3), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_ring_one_call_over_the_gathered_keys(tmp_path, seed, ulysses, ring):
    """``ring_one_call`` (what block-sparse settings use): each rank attends once over every key, its queries
    placed by ``q_offset``, with every mask case (a whole chunk of keys masked at 3 ranks, per-query masks, rows
    with no key): as accurate as one process, the LSE as one process's."""
    res = cp_support.run_topology(tmp_path, ulysses=ulysses, ring=ring, seed=seed, one_call=True)
    _local_calls(res, ulysses, ring, one_call=True)
    _check_ring(res)


@pytest.mark.slow
def test_ring_2(tmp_path, seed):
    _check_ring(cp_support.run_topology(tmp_path, ulysses=1, ring=2, seed=seed))


@pytest.mark.slow
def test_ulysses_3(tmp_path, seed):
    _check_ulysses(cp_support.run_topology(tmp_path, ulysses=3, ring=1, seed=seed))


@pytest.mark.slow
def test_ulysses_2_ring_2(tmp_path, seed):
    _check_ring(cp_support.run_topology(tmp_path, ulysses=2, ring=2, seed=seed))


def test_ring_merge_is_exact_with_empty_chunks(seed):
    """The merge alone, in fp32 against softmax over the concatenated scores: chunks whose keys are all
    masked (lse -inf, output zeros or NaN) carry no weight, and a row empty in every chunk gives 0, -inf."""
    b, s, h, d, n = 2, 5, 3, 8, 3
    scores = torch.randn(n, b, s, h, 7, dtype=torch.float64)
    vals = torch.randn(n, b, h, 7, d, dtype=torch.float64)
    scores[1] = -math.inf                      # chunk 1 fully masked
    scores[:, 1, 2] = -math.inf                # query row (1, 2) masked everywhere
    merge = _RingMerge()
    for i in range(n):
        lse = torch.logsumexp(scores[i], -1)
        p = torch.softmax(scores[i], -1)       # NaN where the chunk is empty, as a kernel may give
        out = torch.einsum("bshk,bhkd->bshd", p, vals[i])
        merge.add(out.float(), lse.float())
    out, lse = merge.result()
    full = torch.cat(list(scores), -1)
    want = torch.einsum("bshk,bhkd->bshd", torch.softmax(full, -1).nan_to_num(0.0), torch.cat(list(vals), 2))
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.allclose(out.double(), want, atol=1e-5)
    want_lse = torch.logsumexp(full, -1)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert torch.allclose(lse.double()[torch.isfinite(want_lse)], want_lse[torch.isfinite(want_lse)], atol=1e-5)
    assert (out[1, 2] == 0).all()
