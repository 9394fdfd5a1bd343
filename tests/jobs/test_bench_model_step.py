"""`sagegen bench` / bench/bench_model_step.py (sagegen.jobs.stepbench.bench) in its CPU smoke mode, and the full-size
architecture table it uses."""

from __future__ import annotations

import json

import pytest
import torch

import sagegen
from sagegen.models import arch




def load_bench():
    from sagegen.jobs.stepbench import bench as stepbench

    return stepbench


@pytest.mark.parametrize("model", ["cogvideox-5b", "hunyuanvideo"])
def test_tiny_mode_writes_a_complete_report(model, tmp_path, seed):
    bench = load_bench()
    out = tmp_path / "step.json"
    report = bench.main([model, "--tiny", "--out", str(out), "--warmup", "0", "--repeats", "1",
                         "--seed", str(seed % 1000), "--compile", "--compile-backend", "eager"])
    on_disk = json.loads(out.read_text())
    assert on_disk["model"] == model and on_disk["tiny"] is True
    for key in ("date", "device", "versions", "sage_config", "inputs", "results", "speedup", "patch_stats"):
        assert key in on_disk, key
    assert on_disk["versions"]["torch"] == torch.__version__ and on_disk["versions"]["diffusers"]
    assert on_disk["sage_config"]["smooth_v"] is True
    assert set(on_disk["results"]) == {"stock", "sagegen", "no_attention", "stock_compiled", "sagegen_compiled"}
    assert all(r["median_s"] > 0 and len(r["times_s"]) == 1 for r in on_disk["results"].values())
    eager = [r for name, r in on_disk["results"].items() if not name.endswith("_compiled")]
    assert all(len(r["cpu_loop_ms"]) == 2 and min(r["cpu_loop_ms"]) > 0 for r in eager)  # the CPU's speed
    assert all(0 < r["host_rss_gb"] < 1024 for r in on_disk["results"].values())  # host memory, per variant
    assert all(r["warmup_s"] == [] for r in on_disk["results"].values())  # --warmup 0: the compile is in the run
    assert report["patch_stats"]["routed"] > 0 and not report["patch_stats"].get("fallback")
    diff = on_disk["diff_vs_stock"]
    assert 0 < diff["sagegen"]["rel_l1"] < 0.05 and diff["sagegen"]["cosine"] > 0.999
    assert diff["no_attention"]["rel_l1"] > 5 * diff["sagegen"]["rel_l1"]  # attention matters in the model
    assert diff["sagegen_compiled"]["rel_l1"] < 0.05
    assert on_disk["inputs"]["batch"] == arch.get_arch(model).batch
    assert "partial" not in on_disk and on_disk["speedup_compiled"] > 0


def test_compiled_only_and_partial_reports(tmp_path, monkeypatch):
    """--compiled-only times stock eager (the reference) and the compiled sides only; a run cut short after a
    variant leaves a report marked partial with what it measured."""
    bench = load_bench()
    out = tmp_path / "step.json"
    report = bench.main(["flux.1-dev", "--tiny", "--out", str(out), "--warmup", "0", "--repeats", "1",
                         "--compile", "--compile-backend", "eager", "--compiled-only"])
    assert set(report["results"]) == {"stock", "stock_compiled", "sagegen_compiled"}
    assert "speedup" not in report and report["speedup_compiled"] > 0
    assert json.loads(out.read_text())["results"].keys() == report["results"].keys()
    with pytest.raises(SystemExit):
        bench.main(["flux.1-dev", "--tiny", "--out", str(out), "--compiled-only"])  # needs --compile

    measured = []
    real = bench.Timer.measure

    def cut_short(self, fn, warmup, repeats):
        if len(measured) == 2:
            raise KeyboardInterrupt  # the third variant never finishes
        measured.append(1)
        return real(self, fn, warmup, repeats)

    monkeypatch.setattr(bench.Timer, "measure", cut_short)
    partial = tmp_path / "partial.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["flux.1-dev", "--tiny", "--out", str(partial), "--warmup", "0", "--repeats", "1"])
    on_disk = json.loads(partial.read_text())
    assert on_disk["partial"] is True and set(on_disk["results"]) == {"stock", "sagegen"}
    assert on_disk["speedup"] > 0 and not list(tmp_path.glob("*.tmp"))


def test_profile_kernel_groups():
    """--profile sorts kernels into attention / quantization / the rest by name (real kernel names)."""
    from sagegen.jobs.stepbench.measure import kernel_group as group
    for name in ("_attn_fwd_sm90", "_attn_fwd_kernel",
                 "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7",
                 "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >",
                 "fmha_cutlassF_bf16_aligned_64x128_rf_sm80"):
        assert group(name) == "attention", name
    from sagegen.kernels import triton_qk_prologue, triton_quant

    # the kernels' own names, so a rename cannot silently move them to "other"
    for kernel in (triton_quant._quant_q_kernel, triton_quant._quant_kv_kernel, triton_quant._kv_stats_kernel,
                   triton_quant._kv_stats_finish_kernel):
        assert group(kernel.fn.__name__) == "quantization", kernel.fn.__name__
    assert group(triton_qk_prologue._norm_rope_kernel.fn.__name__) == "qk_prologue"
    for name in ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "cudnn::ops::nchwToNhwcKernel",
                 "void at::native::elementwise_kernel<128, 4>", "triton_per_fused_native_layer_norm_0"):
        assert group(name) == "other", name


def test_regional_compile_scope(tmp_path):
    """--compile-scope regional compiles diffusers' repeated blocks (fullgraph) for every compiled variant, sagegen's
    fused blocks and FP8 linears included, and leaves the model eager again after each; models without
    _repeated_blocks, or no --compile, are usage errors before any model is built."""
    bench = load_bench()
    out = tmp_path / "step.json"
    report = bench.main(["flux.1-dev", "--tiny", "--out", str(out), "--warmup", "0", "--repeats", "1", "--compile",
                         "--compile-backend", "eager", "--compile-scope", "regional", "--compiled-only",
                         "--linear", "fp8"])
    assert set(report["results"]) == {"stock", "stock_compiled", "sagegen_compiled", "sagegen_fp8_compiled"}
    assert report["compile_scope"] == "regional"
    diff = report["diff_vs_stock"]
    assert diff["stock_compiled"]["rel_l1"] < 1e-6 and diff["sagegen_compiled"]["cosine"] > 0.99
    for argv in (["sd3.5-medium", "--compile", "--compile-scope", "regional"],
                 ["flux.1-dev", "--compile-scope", "regional"]):
        with pytest.raises(SystemExit) as exc:
            bench.main([*argv, "--tiny", "--out", str(tmp_path / "bad.json")])
        assert exc.value.code == 2
    assert not (tmp_path / "bad.json").exists()


def test_host_check_marks_steps_that_waited_on_the_host(monkeypatch):
    """A short CUDA step is profiled once: wall time > 1.1x GPU busy time marks it host-bound, in the entry and
    in the report's summary; long steps are not profiled; no GPU time seen says nothing; a CUDA graph replay is
    profiled but not judged."""
    from sagegen.jobs.stepbench import bench as stepbench
    from sagegen.jobs.stepbench import measure as m

    assert m.host_bound(0.157, 0.079) is True and m.host_bound(0.098, 0.093) is False
    assert m.host_bound(0.1, 0.0) is None
    busy = iter([0.080, 0.095])
    monkeypatch.setattr(m, "profile_step", lambda fn: {"total_s": next(busy)})
    eager, graphs, video = {"median_s": 0.157}, {"median_s": 0.098}, {"median_s": 15.0}
    assert "HOST-BOUND" in m.host_check(eager, None) and eager["host_bound"] is True
    assert "HOST-BOUND" not in m.host_check(graphs, None) and graphs["host_bound"] is False
    assert m.host_check(video, None) == "" and "host_bound" not in video
    replay = {"median_s": 0.101}  # a CUDA graph replay launches nothing from the host: not judged
    monkeypatch.setattr(m, "profile_step", lambda fn: {"total_s": 0.085})
    assert "HOST-BOUND" not in m.host_check(replay, None, replayed=True) and replay["host_bound"] is None
    assert replay["gpu_busy_s"] == 0.085
    results = {"stock": {"median_s": 0.17}, "sagegen_fp8": eager, "sagegen_fp8_graphs": graphs, "stock_graphs": replay}
    outputs = {k: torch.zeros(2) for k in results}
    assert stepbench._summary(results, outputs)["host_bound_variants"] == ["sagegen_fp8"]
    del results["sagegen_fp8"], outputs["sagegen_fp8"]  # (the replay, wall 1.19x busy, stays unjudged)
    assert "host_bound_variants" not in stepbench._summary(results, outputs)


def test_timer_records_the_host_time_of_each_timed_run(monkeypatch):
    """The enqueue time of each timed run (not of warm-ups) is kept, and the log line shows its median next to
    the GPU busy time, so a host-bound step says by how much."""
    from sagegen.jobs.stepbench import measure as m

    timer = m.Timer(torch.device("cpu"))
    calls = []
    # two warm-up calls (5 s: a compile, then 40 ms), then three timed runs: 10, 30, 20 ms
    clock = iter([-10.0, -5.0, -3.0, -2.96, 0.0, 0.010, 1.0, 1.030, 2.0, 2.020])
    monkeypatch.setattr(m.time, "perf_counter", lambda: next(clock))
    out, times, peak = timer.measure(lambda: calls.append(1) or torch.ones(1), warmup=2, repeats=3)
    assert len(calls) == 5 and peak is None
    assert timer.warmup_times == pytest.approx([5.0, 0.04])
    assert timer.host_times == pytest.approx([0.010, 0.030, 0.020]) and times == timer.host_times
    monkeypatch.setattr(m, "profile_step", lambda fn: {"total_s": 0.079})
    entry = {"median_s": 0.12, "host_median_s": 0.118}
    note = m.host_check(entry, None)
    assert "GPU busy 79.0 ms  host 118.0 ms  HOST-BOUND" in note
    assert "host " not in m.host_check({"median_s": 0.12}, None)  # an entry without host times
    # with the CPU's speed around the timed runs (a contended vCPU runs the loop ~2x slower)
    entry = {"median_s": 0.12, "host_median_s": 0.118, "cpu_loop_ms": [12.3, 24.6]}
    assert "host 118.0 ms (CPU loop 12/25 ms)  HOST-BOUND" in m.host_check(entry, None)


def test_cpu_loop_times_a_fixed_loop(monkeypatch):
    from sagegen.jobs.stepbench import measure as m

    clock = iter([0.0, 0.020, 1.0, 1.012, 2.0, 2.015])  # three tries: the best is kept
    monkeypatch.setattr(m.time, "perf_counter", lambda: next(clock))
    assert m.cpu_loop_ms() == pytest.approx(12.0)


def test_bad_arguments(tmp_path):
    bench = load_bench()
    with pytest.raises(SystemExit):
        bench.main(["no-such-model", "--tiny", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        bench.main(["flux.1-dev", "--tiny", "--out", str(tmp_path / "x.json"), "--repeats", "0"])
    with pytest.raises(SystemExit):
        bench.main(["flux.1-dev", "--tiny", "--out", str(tmp_path / "x.json"), "--sage-config", "[1]"])
    assert not (tmp_path / "x.json").exists()


# Tokens per sample of each model at its default resolution (/work/shared/anchors/attention-h200.md).
ANCHOR_TOKENS = {"cogvideox-2b": 17776, "cogvideox-5b": 17776, "cogvideox1.5-5b": 45106, "hunyuanvideo": 119056,
                 "flux.1-dev": 4608, "sd3.5-large": 4429}


def test_default_shapes_match_the_anchors():
    for name, tokens in ANCHOR_TOKENS.items():
        assert arch.tokens_per_sample(name) == tokens, name
    assert arch.tokens_per_sample("hunyuanvideo", height=544, width=960) == 67576  # the 544p anchor
    mochi = arch.tokens_per_sample("mochi-1") - 256  # latent tokens; plus each sample's valid text tokens
    assert mochi == 44520


# Published sizes of the transformers (parameters, billions), as a check that the configs are the real ones.
PARAMS_B = {"cogvideox-2b": 1.69, "cogvideox-5b": 5.57, "hunyuanvideo": 12.82, "mochi-1": 10.03,
            "flux.1-dev": 11.90, "sd3.5-large": 8.06, "sd3.5-medium": 2.24}


def test_full_size_configs_build_with_the_published_sizes():
    for name, billions in PARAMS_B.items():
        model = arch.build_transformer(name, device="meta")
        n = sum(p.numel() for p in model.parameters()) / 1e9
        assert abs(n - billions) / billions < 0.01, (name, n)
    assert arch.get_arch("sd3.5-medium").config["dual_attention_layers"] == tuple(range(13))
    with pytest.raises(ValueError, match="unknown architecture 'sdxl'.*cogvideox-5b"):
        arch.get_arch("sdxl")


@pytest.mark.parametrize("name", sorted(arch.ARCHS))
def test_example_inputs_drive_every_architecture(name):
    """Each config, shrunk to one layer of each kind, runs a forward on example_inputs at a small size."""
    model = arch.build_transformer(name, dtype=torch.float32, device="cpu", config_overrides=arch.smoke_overrides(name))
    a = arch.get_arch(name)
    frames = (13 if a.family == "mochi" else 9) if a.frames else None
    batch = 2 if a.family == "hunyuanvideo" else None  # HunyuanVideo's default step has no CFG batch
    inputs = arch.example_inputs(name, batch=batch, height=64, width=64, frames=frames, dtype=torch.float32,
                                 device="cpu")
    with torch.no_grad():
        out = model(**inputs)[0]
    expected = tuple(inputs["hidden_states"].shape)
    if a.family == "hunyuanvideo15":  # its input adds the image condition and mask channels (65 in, 32 out)
        expected = (expected[0], a.config["out_channels"], *expected[2:])
    assert tuple(out.shape) == expected and torch.isfinite(out).all()
    assert out.shape[0] == (batch or a.batch)
    if a.family in ("hunyuanvideo", "mochi"):
        mask = inputs["encoder_attention_mask"]
        assert mask.sum(dim=1).unique().numel() == mask.shape[0] == 2  # prompts of different lengths


def test_sagegen_bench_command(tmp_path, monkeypatch):
    """The CLI command runs the same benchmark; an unknown model is a usage error (exit 2)."""
    from typer.testing import CliRunner

    from sagegen.cli.app import app

    runner = CliRunner()
    out = tmp_path / "b.json"
    r = runner.invoke(app, ["bench", "cogvideox-5b", "--random-weights", "--tiny", "--warmup", "0", "--repeats",
                            "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert report["model"] == "cogvideox-5b" and report["results"]["sagegen"]["median_s"] > 0
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    r = runner.invoke(app, ["bench", "not-a-model"])
    assert r.exit_code == 2 and "unknown model 'not-a-model'" in r.output
    r = runner.invoke(app, ["bench", "cogvideox-2b", "--tiny", "--repeats", "many"])
    assert r.exit_code == 2 and "argument --repeats: invalid int value: 'many'" in r.output


def test_torchao_variants_quantize_the_same_layers(tmp_path, monkeypatch):
    """--torchao hands torchao's quantize_ exactly the layers sagegen's FP8 quantizes, then times both
    attentions with them. torchao refuses float8 on a CPU, so a stand-in module records what it is given
    (the real one runs on the GPU: lab/NOTES.md)."""
    seen = {}

    class Config:
        def __init__(self, granularity):
            seen["granularity"] = granularity

    def quantize_(model, config, filter_fn):
        seen["layers"] = {n for n, m in model.named_modules() if filter_fn(m, n)}

    from sagegen.jobs.stepbench import torchao_variants as stepbench_torchao

    monkeypatch.setattr(stepbench_torchao, "load_torchao", lambda: (Config, lambda: "row", quantize_))
    bench = load_bench()
    for extra in ([], ["--linear", "fp8"]):  # layer names from a patch/unpatch cycle, or from the fp8 variant
        seen.clear()
        report = bench.main(["flux.1-dev", "--tiny", "--out", str(tmp_path / "t.json"), "--warmup", "0",
                             "--repeats", "1", "--torchao", "--no-zero-attention", "--linear-policy",
                             '{"keep_blocks": []}', *extra])
        assert {"torchao_fp8", "sagegen_torchao_fp8"} <= set(report["results"])
        assert seen["granularity"] == "row" and seen["layers"]
        model = bench.archs.build_transformer("flux.1-dev", dtype=torch.bfloat16, device="cpu", seed=0,
                                              config_overrides=bench.archs.smoke_overrides("flux.1-dev"))
        sagegen.patch(model, linear="fp8", linear_policy=sagegen.LinearPolicy(keep_blocks=()))
        assert seen["layers"] == set(sagegen.patch_info(model)["linear"]["fp8_layers"])
        assert report["speedup_torchao_fp8"] > 0 and report["speedup_sagegen_torchao_fp8"] > 0


def test_torchao_missing_is_reported_not_fatal(tmp_path, monkeypatch, capsys):
    from sagegen.jobs.stepbench import torchao_variants as stepbench_torchao

    def missing():
        raise ModuleNotFoundError("No module named 'torchao'")

    monkeypatch.setattr(stepbench_torchao, "load_torchao", missing)
    report = load_bench().main(["flux.1-dev", "--tiny", "--out", str(tmp_path / "t.json"), "--warmup", "0",
                                "--repeats", "1", "--torchao", "--no-zero-attention"])
    assert "torchao_fp8" not in report["results"] and "sagegen" in report["results"]
    assert "torchao variants skipped" in capsys.readouterr().out


def test_only_times_the_named_variants(tmp_path, capsys):
    """--only keeps the stock reference and the named variants (no compile for the rest); names outside what
    the options enable are a usage error that lists the valid ones."""
    bench = load_bench()
    report = bench.main(["flux.1-dev", "--tiny", "--out", str(tmp_path / "t.json"), "--warmup", "0", "--repeats",
                         "1", "--compile", "--compile-backend", "eager", "--linear", "fp8",
                         "--only", "sagegen_fp8_compiled, sagegen"])
    assert set(report["results"]) == {"stock", "sagegen", "sagegen_fp8_compiled"}
    assert report["speedup"] > 0
    assert "speedup_fp8_compiled" not in report  # its reference (compiled stock) was left out
    for bad in (["--only", "sagegen_fp8"], ["--compile", "--only", "torchao_fp8_compiled"], ["--only", ","]):
        with pytest.raises(SystemExit) as exc:
            bench.main(["flux.1-dev", "--tiny", "--out", str(tmp_path / "x.json"), *bad])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "not among the variants" in err and "stock_compiled" in err


def test_sparse_with_compiled_only_runs_no_sparse_variant(tmp_path):
    """The sparse variants are eager; --compiled-only leaves them out (it used to fail looking up sagegen)."""
    report = load_bench().main(["flux.1-dev", "--tiny", "--out", str(tmp_path / "t.json"), "--warmup", "0",
                                "--repeats", "1", "--compile", "--compile-backend", "eager", "--compiled-only",
                                "--sparse", "topk=0.5"])
    assert set(report["results"]) == {"stock", "stock_compiled", "sagegen_compiled"}


def test_cuda_graph_variants_time_replays(tmp_path, monkeypatch):
    """--cuda-graphs times stock, sagegen and sagegen + FP8 with graph replays (a recording stand-in for the
    capture on the CPU, as in test_patch_graphs): every timed run is a replay, and the replayed outputs match
    the eager variants'."""
    from tests.patch.test_patch_graphs import recording_capture

    from sagegen.patch import graphs

    monkeypatch.setattr(graphs, "on_gpu", lambda t: True)
    monkeypatch.setattr(graphs, "capture", recording_capture)
    replays = []
    original = graphs.GraphedForward._replay
    monkeypatch.setattr(graphs.GraphedForward, "_replay",
                        lambda self, entry, leaves, **kw: replays.append(1) or original(self, entry, leaves, **kw))
    report = load_bench().main(["flux.1-dev", "--tiny", "--out", str(tmp_path / "t.json"), "--warmup", "1",
                                "--repeats", "2", "--cuda-graphs", "--linear", "fp8", "--no-zero-attention"])
    assert {"stock_graphs", "sagegen_graphs", "sagegen_fp8_graphs"} <= set(report["results"])
    assert len(replays) == 3 * 3  # per variant: the capture's replay (warm-up) and the two timed runs
    for name in ("stock_graphs", "sagegen_graphs", "sagegen_fp8_graphs"):
        info = report["results"][name]["cuda_graphs"]
        assert info["graphs"] == 1 and info["calls"]["captured"] == 1 and not info["failed"], (name, info)
    diff = report["diff_vs_stock"]
    assert diff["stock_graphs"]["rel_l1"] == 0.0
    assert diff["sagegen_graphs"]["rel_l1"] == diff["sagegen"]["rel_l1"]
    assert diff["sagegen_fp8_graphs"]["rel_l1"] == diff["sagegen_fp8"]["rel_l1"]
    assert report["speedup_fp8_graphs"] > 0 and report["stock_graphs_vs_stock"] > 0
