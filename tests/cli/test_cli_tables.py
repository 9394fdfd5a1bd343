"""The result tables and notes printed by `run` / `compare` (computed from the manifest)."""

import pytest
from rich.console import Console

from sagegen.cli.tables import (attention_warnings, compare_table, cpu_note, fp8_eager_note, fp8_idle_note, run_notes,
                                run_table, setup_lines, sparse_dense_note, speedups)


def _manifest():
    samples = [{"id": f"p00{i}-s0", "prompt": f"prompt {i}", "seed": 0} for i in range(3)]
    t = lambda total, den: {"total_s": total, "encode_s": 0.1, "denoise_s": den,  # noqa: E731
                            "decode_s": total - den - 0.1, "save_s": 0.01}
    return {"model": {"name": "m"}, "samples": samples, "variants": ["sdpa", "sage"],
            "runtime": {"device": "cuda"},
            "timings": {"sdpa": {"p000-s0": t(4.0, 3.0), "p001-s0": t(6.0, 5.0), "p002-s0": t(5.0, 4.0)},
                        "sage": {"p000-s0": t(2.5, 1.5), "p001-s0": t(3.5, 2.5)}},
            "setup": {"sdpa": {"rank0": {"load_s": 2.0, "source": "x", "patch_s": 0.0, "warmup_s": 1.0}},
                      "sage": {"rank0": {"load_s": 0.0, "patch_s": 0.01, "warmup_s": 3.0,
                                         "attention_calls": {"routed": 40, "processor_calls": 40}}}}}


def _render(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_speedups_only_for_pairs():
    rows = speedups(_manifest())
    assert [r["id"] for r in rows] == ["p000-s0", "p001-s0"]
    assert rows[0]["speedup_denoise"] == pytest.approx(2.0) and rows[1]["speedup_total"] == pytest.approx(6 / 3.5)


def test_compare_table_sums_row():
    text = _render(compare_table(_manifest()))
    assert "2.00×" in text  # p000 denoise speedup
    sums = next(line for line in text.splitlines() if "(sums)" in line)
    for cell in ("10.00", "6.00", "8.00", "4.00", "2.00×", "1.67×"):  # denoise 8/4, total 10/6
        assert cell in sums
    assert "p002-s0" not in text  # sage has not finished it


def test_run_table_and_setup_lines():
    text = _render(run_table(_manifest(), "sdpa"))
    assert "p002-s0" in text and "mean" in text and "5.00" in text
    lines = setup_lines(_manifest())
    assert lines[0] == "sdpa: load 2.00 s, patch 0.00 s, warmup 1.00 s"
    assert "load" not in lines[1] and "attention calls: routed 40" in lines[1]


def test_attention_warnings_and_cpu_note():
    m = _manifest()
    assert attention_warnings(m) == [] and cpu_note(m) is None
    m["setup"]["sage"]["rank0"]["attention_calls"] = {"processor_calls": 40, "unrouted_processor_calls": 40}
    assert "no attention call went to sagegen" in attention_warnings(m)[0]
    m["setup"]["sage"]["rank0"]["attention_calls"] = {"routed": 40, "fallback": 40}
    assert "fell back" in attention_warnings(m)[0]
    m["runtime"]["device"] = "cpu"
    assert "emulation" in cpu_note(m)


def test_fp8_eager_note_only_for_eager_gpu_fp8_on_image_models():
    m = _manifest()
    m["model"]["kind"] = "image"
    m["runtime"].update(compile=False, cuda_graphs=False)
    assert fp8_eager_note(m) is None  # no FP8 layers
    m["setup"]["sage"]["rank0"]["linear"] = {"fp8_layer_count": 474, "emulated": False}
    assert "--cuda-graphs" in fp8_eager_note(m) and run_notes(m) == [fp8_eager_note(m)]
    for change in ({"runtime": {"device": "cuda", "cuda_graphs": True}},
                   {"runtime": {"device": "cuda", "compile": True}},
                   {"model": {"name": "m", "kind": "video"}}):
        assert fp8_eager_note({**m, **change}) is None, change
    m["setup"]["sage"]["rank0"]["linear"]["emulated"] = True
    assert fp8_eager_note(m) is None
    m["runtime"]["device"] = "cpu"
    assert run_notes(m) == [cpu_note(m)]


def test_fp8_idle_note_when_no_layer_ran_fp8():
    m = _manifest()
    rank = m["setup"]["sage"]["rank0"]
    assert fp8_idle_note(m) is None  # no --linear
    rank["linear"] = {"fp8_layer_count": 0, "fp8_calls": 0, "emulated": True}
    assert "first and last blocks" in fp8_idle_note(m) and fp8_idle_note(m) in run_notes(m)
    rank["linear"] = {"fp8_layer_count": 12, "fp8_calls": 0, "emulated": True}
    assert "min_rows" in fp8_idle_note(m) and "12 FP8 layers" in fp8_idle_note(m)
    rank["linear"]["fp8_calls"] = 30
    assert fp8_idle_note(m) is None


def test_sparse_dense_note_when_sparse_never_ran():
    m = _manifest()
    rank = m["setup"]["sage"]["rank0"]
    assert sparse_dense_note(m) is None  # no --sparse
    rank["sparse"] = {"config": {"min_tokens": 4096, "dense_steps": 0.25, "dense_blocks": [0]}}
    rank["attention_calls"] = {"sparse_dense_calls": 32, "routed": 32}
    note = sparse_dense_note(m)
    assert "all 32 attention calls ran dense" in note and "4096 tokens" in note and note in run_notes(m)
    rank["attention_calls"]["sparse_calls"] = 8  # some calls did run sparse: no note
    assert sparse_dense_note(m) is None
