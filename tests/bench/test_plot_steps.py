"""bench/plot_steps.py: the README's step chart is drawn from the committed result files, and says so when one
is missing instead of drawing without it."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_plot_steps():
    spec = importlib.util.spec_from_file_location("plot_steps", ROOT / "bench" / "plot_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_bar_is_a_ratio_within_its_own_run_and_matches_the_readme():
    plot_steps = load_plot_steps()
    rows = plot_steps.speedups()
    assert [r["model"] for r in rows] == [m for m, _ in plot_steps.ROWS]
    readme = (ROOT / "README.md").read_text()
    for (model, sources), row in zip(plot_steps.ROWS, rows):
        for key, ref in sources.items():
            name, _, variant = ref.partition("#")
            runs = json.loads((plot_steps.RESULTS / name).read_text())["results"]
            expected = runs["stock"]["median_s"] / runs[variant or key]["median_s"]
            assert row["bars"][key][0] == pytest.approx(expected, rel=1e-12)
            # the README's table shows the same ratio, to two decimals
            assert f"{expected:.2f}×" in readme, (model, key, expected)


def test_a_missing_result_file_or_variant_is_an_error(tmp_path):
    plot_steps = load_plot_steps()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_steps.speedups(tmp_path)
    for _, sources in plot_steps.ROWS:
        for ref in sources.values():
            name = ref.partition("#")[0]
            if not (tmp_path / name).exists():
                shutil.copy(plot_steps.RESULTS / name, tmp_path / name)
    first = plot_steps.ROWS[0][1]["sagegen"]
    data = json.loads((tmp_path / first).read_text())
    del data["results"]["sagegen"]
    (tmp_path / first).write_text(json.dumps(data))
    with pytest.raises(KeyError, match="'sagegen'"):
        plot_steps.speedups(tmp_path)


def test_the_chart_is_written_whole_and_the_committed_one_is_current(tmp_path):
    pytest.importorskip("matplotlib")
    plot_steps = load_plot_steps()
    out = plot_steps.plot(plot_steps.speedups(), tmp_path / "steps.svg")
    drawn = out.read_text()
    assert drawn.rstrip().endswith("</svg>") and not list(tmp_path.glob("*.tmp*"))
    for model, _ in plot_steps.ROWS:
        assert model.replace("&", "&amp;") in drawn
    # the committed chart carries the same numbers (re-run bench/plot_steps.py after changing the data)
    labels = sorted(re.findall(r"\d+\.\d\d×", drawn))
    committed = (ROOT / "docs" / "step-speedups.svg").read_text()
    assert sorted(re.findall(r"\d+\.\d\d×", committed)) == labels
