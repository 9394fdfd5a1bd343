"""Result tables printed by `run` and `compare` (from the manifest, so they cover every process's samples)."""

from __future__ import annotations

from statistics import mean

from rich.console import Console
from rich.table import Table


def result_console() -> Console:
    """Console for result tables on stdout; at least 120 columns when writing to a file or pipe."""
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    return console


def cpu_note(manifest: dict) -> str | None:
    if manifest.get("runtime", {}).get("device") == "cpu" and "sage" in manifest.get("variants", []):
        return ("note: on the CPU sagegen runs its PyTorch emulation of the kernels (correct, not fast); "
                "speedups need a GPU")
    return None


def fp8_eager_note(manifest: dict) -> str | None:
    """Eager FP8 linears on an image model's GPU run: ~4-7k tokens a call leave the step bound by the host,
    and FP8 adds launches (lab/NOTES.md v5.1-v5.5), so it can be slower than attention alone."""
    runtime = manifest.get("runtime", {})
    if (runtime.get("device") in (None, "cpu") or runtime.get("compile") or runtime.get("cuda_graphs")
            or manifest.get("model", {}).get("kind") != "image"):
        return None
    fp8 = any(rank.get("linear", {}).get("fp8_layer_count") and not rank["linear"].get("emulated")
              for variant in manifest.get("setup", {}).values() for rank in variant.values()
              if isinstance(rank, dict))
    if not fp8:
        return None
    return ("note: eager FP8 linears on an image model are host-bound (~4-7k tokens a call): their speed depends on "
            "the host CPU and can fall below attention alone; --cuda-graphs makes it steady (docs/cuda-graphs.md)")


def sparse_dense_note(manifest: dict) -> str | None:
    """--sparse asked for, but every attention call ran dense (short calls, cross-attention, the first steps and
    the first block stay dense by policy), so the run measured dense attention."""
    for variant in manifest.get("setup", {}).values():
        for rank in variant.values():
            if not isinstance(rank, dict) or "sparse" not in rank:
                continue
            calls = rank.get("attention_calls", {})
            if calls.get("sparse_dense_calls") and not calls.get("sparse_calls"):
                cfg = rank["sparse"].get("config", {})
                steps = cfg.get("dense_steps")
                steps = f"{steps:.0%} of the steps" if isinstance(steps, float) and steps < 1 else f"{steps} steps"
                return (f"note: --sparse was on, but all {calls['sparse_dense_calls']} attention calls ran dense: "
                        f"calls under {cfg.get('min_tokens')} tokens, cross-attention, the first {steps} and blocks "
                        f"{cfg.get('dense_blocks')} stay dense (docs/sparse.md)")
    return None


def fp8_idle_note(manifest: dict) -> str | None:
    """--linear fp8 asked for, but no call ran FP8: the policy kept every layer bf16 (a tiny model has only its
    first and last blocks), or every call was shorter than ``min_rows`` tokens."""
    for variant in manifest.get("setup", {}).values():
        for rank in variant.values():
            linear = rank.get("linear") if isinstance(rank, dict) else None
            if not linear or linear.get("fp8_calls") != 0:
                continue
            if not linear.get("fp8_layer_count"):
                why = ("LinearPolicy keeps the embedders, the final projection and the first and last blocks in bf16, "
                       "and this model has no other linear")
            else:
                why = (f"each of its {linear['fp8_layer_count']} FP8 layers was called with fewer tokens than "
                       "LinearPolicy.min_rows (1024 by default), where FP8 does not pay")
            return f"note: --linear fp8 was on, but no layer ran FP8: {why} (docs/fp8-linear.md)"
    return None


def run_notes(manifest: dict) -> list[str]:
    """The notes `run` and `compare` print after their tables."""
    return [n for n in (cpu_note(manifest), fp8_eager_note(manifest), fp8_idle_note(manifest),
                        sparse_dense_note(manifest)) if n]


def _short(text: str, n: int = 28) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _s(v) -> str:
    return "—" if v is None else f"{v:.2f}"


def _samples(manifest: dict) -> list[dict]:
    return manifest.get("samples", [])


def run_table(manifest: dict, variant: str) -> Table:
    """Per-sample timings of one variant."""
    timings = manifest.get("timings", {}).get(variant, {})
    table = Table(title=f"{manifest['model']['name']} · {variant}", title_justify="left")
    for col in ("sample", "prompt"):
        table.add_column(col, no_wrap=True)
    for col in ("total s", "encode s", "denoise s", "decode s", "save s"):
        table.add_column(col, justify="right", no_wrap=True)
    rows = [s for s in _samples(manifest) if s["id"] in timings]
    for s in rows:
        t = timings[s["id"]]
        table.add_row(s["id"], _short(s["prompt"]), _s(t.get("total_s")), _s(t.get("encode_s")),
                      _s(t.get("denoise_s")), _s(t.get("decode_s")), _s(t.get("save_s")))
    if len(rows) > 1:
        table.add_section()
        col = lambda k: mean(timings[s["id"]].get(k) or 0.0 for s in rows)  # noqa: E731
        table.add_row("mean", f"{len(rows)} samples", *(_s(col(k)) for k in
                                                         ("total_s", "encode_s", "denoise_s", "decode_s", "save_s")))
    return table


def speedups(manifest: dict, base: str = "sdpa", new: str = "sage") -> list[dict]:
    """Rows for samples finished in both variants: times and speedups (base / new)."""
    tb, tn = (manifest.get("timings", {}).get(v, {}) for v in (base, new))
    rows = []
    for s in _samples(manifest):
        a, b = tb.get(s["id"]), tn.get(s["id"])
        if not a or not b:
            continue
        row = {"id": s["id"], "prompt": s["prompt"], "base_total": a["total_s"], "new_total": b["total_s"],
               "base_denoise": a["denoise_s"], "new_denoise": b["denoise_s"]}
        row["speedup_denoise"] = a["denoise_s"] / b["denoise_s"] if b["denoise_s"] > 0 else None
        row["speedup_total"] = a["total_s"] / b["total_s"] if b["total_s"] > 0 else None
        rows.append(row)
    return rows


def compare_table(manifest: dict, base: str = "sdpa", new: str = "sage") -> Table:
    rows = speedups(manifest, base, new)
    table = Table(title=f"{manifest['model']['name']} · {base} vs {new}", title_justify="left",
                  caption="speedup = sdpa time / sage time (denoising loop, and whole pipeline call)",
                  caption_justify="left")
    table.add_column("sample", no_wrap=True)
    table.add_column("prompt", no_wrap=True)
    for col in (f"{base} total s", f"{new} total s", f"{base} denoise s", f"{new} denoise s",
                "speedup denoise", "speedup total"):
        table.add_column(col.replace(" ", "\n", 1), justify="right", no_wrap=True)

    def x(v):
        return "—" if v is None else f"{v:.2f}×"

    for r in rows:
        table.add_row(r["id"], _short(r["prompt"]), _s(r["base_total"]), _s(r["new_total"]), _s(r["base_denoise"]),
                      _s(r["new_denoise"]), x(r["speedup_denoise"]), x(r["speedup_total"]))
    if len(rows) > 1:
        table.add_section()
        tot = {k: sum(r[k] for r in rows) for k in ("base_total", "new_total", "base_denoise", "new_denoise")}
        table.add_row("all", f"{len(rows)} samples (sums)", *(_s(tot[k]) for k in tot),
                      x(tot["base_denoise"] / tot["new_denoise"] if tot["new_denoise"] > 0 else None),
                      x(tot["base_total"] / tot["new_total"] if tot["new_total"] > 0 else None))
    return table


def setup_lines(manifest: dict) -> list[str]:
    """One line per variant (and process) with the one-off costs: load, patch, compile, warm-up."""
    out = []
    for variant, ranks in manifest.get("setup", {}).items():
        for rank, s in sorted(ranks.items()):
            parts = [f"{k[:-2]} {v:.2f} s" for k, v in s.items()
                     if k.endswith("_s") and isinstance(v, (int, float)) and (v or k != "load_s")]
            calls = s.get("attention_calls")
            if calls:
                parts.append("attention calls: " + ", ".join(f"{k} {v}" for k, v in calls.items()))
            who = f" ({rank})" if len(ranks) > 1 else ""
            out.append(f"{variant}{who}: " + ", ".join(parts))
    return out


def attention_warnings(manifest: dict) -> list[str]:
    """Warnings when the sage variant did not (fully) run sagegen's kernels."""
    out = []
    for rank, s in manifest.get("setup", {}).get("sage", {}).items():
        calls = s.get("attention_calls") or {}
        if not calls:
            continue
        who = f" ({rank})" if len(manifest["setup"]["sage"]) > 1 else ""
        if not calls.get("routed"):
            out.append(f"warning{who}: no attention call went to sagegen in the sage variant ({calls}); its "
                       "timings are the stock attention's")
        elif calls.get("fallback"):
            out.append(f"warning{who}: {calls['fallback']} of {calls['routed']} sagegen attention calls fell back "
                       "to SDPA (see `sagegen env`)")
    return out
