"""bench/bench_out_proj.py without a GPU: its usage errors exit 2 before anything runs, and its table of shapes
is consistent (projected rows inside the call's tokens)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_out_proj  # noqa: E402


def test_unknown_model_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_out_proj.main(["--only", "flux.1-dev,nope"])
    assert exc.value.code == 2
    assert "nope" in capsys.readouterr().err


def test_shapes_project_rows_of_their_call():
    for model, b, h, n, d, rows in bench_out_proj.SHAPES:
        assert d in (64, 128) and b >= 1 and h >= 1
        if rows is not None:
            assert 0 <= rows[0] < rows[1] <= n, model
