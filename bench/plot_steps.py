"""The README's step table as a chart: speedup over stock eager per model, read from the measured JSON.

Every bar is a ratio within one run (a variant's median step time over the same run's stock median), so bars
from different runs never share a denominator. `ROWS` names, for each README row, the result file each bar
comes from, as listed in bench/results/current/steps.json; a file or variant that is missing is an error, so
the chart cannot quietly drift from the data.

    python bench/plot_steps.py                      # -> docs/step-speedups.svg
    python bench/plot_steps.py --out /tmp/x.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "current"  # the files README.md and docs/results.md use

# The bars: what a user turns on, in order (label, variant key in the result file's "results").
SERIES = (
    ("sagegen attention", "sagegen"),
    ("+ FP8 linears", "sagegen_fp8"),
    ("+ FP8 linears, CUDA graphs", "sagegen_fp8_graphs"),
    ("sagegen attention + block-sparse top-k 0.5", "sagegen_sparse[topk=0.5]"),
)

# README row -> {variant key: result file}, read from the index in bench/results/current/ (steps.json), which
# names the files the README's table draws on; the sparse runs name their variant with their options
# ("file#variant"). To move the chart to new runs, put their files in current/ and edit the index.
INDEX = RESULTS / "steps.json"


def load_rows(index: Path = INDEX) -> tuple[tuple[str, dict[str, str]], ...]:
    """The rows of the index, in order: (README row label, {series key: "file" or "file#variant"})."""
    data = json.loads(index.read_text())
    return tuple((row["model"], dict(row["bars"])) for row in data["rows"])


ROWS: tuple[tuple[str, dict[str, str]], ...] = load_rows()


def _device_tag(data: dict) -> str:
    name = str(data.get("device", {}).get("name", "?"))
    gpu = "H200" if "H200" in name else "H100" if "H100" in name else name
    triton = str(data.get("versions", {}).get("triton", "?")).rsplit(".", 1)[0]
    return f"{gpu}, {str(data.get('date', ''))[:10]}, Triton {triton}"


def speedups(results_dir: Path = RESULTS) -> list[dict]:
    """One dict per row: {"model", "bars": {series key: (speedup, source tag)}}. Raises on missing data."""
    cache: dict[str, dict] = {}
    rows = []
    for model, sources in ROWS:
        bars = {}
        for key, ref in sources.items():
            name, _, variant = ref.partition("#")
            if name not in cache:
                path = results_dir / name
                if not path.is_file():
                    raise FileNotFoundError(f"{model}: result file {path} does not exist")
                cache[name] = json.loads(path.read_text())
            data = cache[name]
            runs = data.get("results", {})
            variant = variant or key
            if "stock" not in runs or variant not in runs:
                raise KeyError(f"{model}: {name} has no 'stock' or '{variant}' result (has {sorted(runs)})")
            bars[key] = (runs["stock"]["median_s"] / runs[variant]["median_s"], _device_tag(data))
        rows.append({"model": model, "bars": bars})
    return rows


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "sagegen"  # stable ids: the SVG changes only when the data does
    height = 0.26
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.6))
    colors = dict(zip((key for _, key in SERIES), ("#4c72b0", "#dd8452", "#c44e52", "#55a868")))
    drawn = set()
    for r, row in enumerate(rows):
        present = [(label, key) for label, key in SERIES if key in row["bars"]]
        for s, (label, key) in enumerate(present):  # a row's bars packed around its tick
            x = row["bars"][key][0]
            bar = ax.barh(r + (s - (len(present) - 1) / 2) * height, x, height=height * 0.9, color=colors[key],
                          label=None if key in drawn else label)
            ax.bar_label(bar, labels=[f"{x:.2f}×"], padding=2, fontsize=7)
            drawn.add(key)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [row["model"] for row in rows])
    ax.invert_yaxis()
    ax.set_xscale("log", base=2)
    ticks = [1, 1.5, 2, 3, 4, 6, 8]
    ax.set_xticks(ticks, [f"{t:g}×" for t in ticks])
    ax.set_xlim(0.9, max(x for row in rows for x, _ in row["bars"].values()) * 1.35)
    ax.set_xlabel("one denoising step, speedup over stock diffusers eager (same run; log scale)")
    ax.grid(axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    order = [labels.index(label) for label, _ in SERIES if label in labels]
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8, loc="lower right")
    ax.set_title("sagegen.patch on full-size transformers with random weights (H200, torch 2.11)",
                 fontsize=9)
    fig.text(0.01, 0.005, "¹ stock hands SDPA a dense [B, 1, S, S] mask there; sagegen a key mask.", fontsize=7)
    fig.tight_layout()
    from sagegen.runs.files import atomic_write_file  # a unique temporary name beside it (same suffix: the format)

    atomic_write_file(out, lambda tmp: fig.savefig(tmp, metadata={"Date": None} if out.suffix == ".svg" else None))
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "step-speedups.svg")
    args = parser.parse_args(argv)
    rows = speedups()
    for row in rows:
        print(row["model"], {k: f"{v:.2f}x ({tag})" for k, (v, tag) in row["bars"].items()})
    print("wrote", plot(rows, args.out))


if __name__ == "__main__":
    main()
