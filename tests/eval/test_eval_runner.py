"""`sagegen eval` end to end on synthetic run directories: metrics.json contents, skips with reasons,
merging, the default run directory, and option errors."""

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from sagegen.eval import fidelity
from sagegen.runs.reader import load_frames, load_run
from sagegen.eval.runner import EvalOptions, evaluate, parse_metrics
from sagegen.testing.metric_standins import write_tiny_clip, write_tiny_inception, write_tiny_lpips
from sagegen.testing.run_dirs import make_synthetic_run
from sagegen.eval.weights import BadOption


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    d = tmp_path_factory.mktemp("w")
    return {"clip": f"local-dir:{write_tiny_clip(d / 'clip')}", "inception": str(write_tiny_inception(d / 'inc.pt')),
            "lpips": str(write_tiny_lpips(d / 'lpips.pth'))}


@pytest.fixture
def run(tmp_path):
    return make_synthetic_run(tmp_path / "runs" / "r1", prompts=["a red ball", "a blue boat", "a green tree"],
                              frames=5, height=40, width=56, sigma=4.0)


def app():
    from sagegen.cli import eval_cmd, report_cmd

    a = typer.Typer()
    eval_cmd.register(a)
    report_cmd.register(a)
    return a


def test_parse_metrics():
    assert parse_metrics(["psnr,ssim", "psnr", "CLIP-T"], "video") == ["psnr", "ssim", "clipt"]
    assert "clipscore" not in parse_metrics(["all"], "video") and "clipsim" not in parse_metrics(["all"], "image")
    with pytest.raises(BadOption, match="--metric: unknown metric 'psnrr'.*clipsim"):
        parse_metrics(["psnrr"])
    # no --metric means every metric that applies (issue 22, bug 2: `sagegen eval RUN_DIR` exited 2)
    assert parse_metrics([], "video") == parse_metrics(["all"], "video")
    assert parse_metrics([""], "image") == parse_metrics(["all"], "image")


def test_all_metrics_with_standins(run, weights):
    opts = EvalOptions(metrics=parse_metrics(["all"], "video"), clip_model=weights["clip"],
                       inception_weights=weights["inception"], lpips_weights=weights["lpips"])
    doc = evaluate(run, opts, log=lambda s: None)
    on_disk = json.loads((run / "metrics.json").read_text())
    assert on_disk == json.loads(json.dumps(doc))
    m = doc["metrics"]
    assert set(m) == {"clipsim", "clipt", "fid", "kid", "psnr", "ssim", "lpips"}
    assert all(e["status"] == "ok" for e in m.values()), {k: e.get("reason") for k, e in m.items()}
    # paired PSNR equals a direct computation on the lossless frames
    s0 = load_run(run).samples[0]
    want = fidelity.psnr_frames(load_frames(s0.frame_paths("sage")), load_frames(s0.frame_paths("sdpa")))
    assert m["psnr"]["per_sample"]["sage"][s0.id]["per_frame"] == pytest.approx(want)
    assert m["psnr"]["aggregate"]["sage"]["n"] == 3
    lo, hi = m["psnr"]["aggregate"]["sage"]["ci"]
    assert lo <= m["psnr"]["aggregate"]["sage"]["mean"] <= hi
    # per-variant CLIP metrics carry sage - baseline deltas with CIs
    d = m["clipsim"]["delta"]["sage"]
    per = m["clipsim"]["per_sample"]
    want_delta = np.mean([per["sage"][i]["value"] - per["sdpa"][i]["value"] for i in per["sage"]])
    assert d["mean"] == pytest.approx(want_delta) and d["n"] == 3
    assert m["clipsim"]["mode"] == "evalcrafter" and "not comparable" in m["clipsim"]["note"]
    # set metrics: sage vs baseline, with the small-N warning
    assert m["fid"]["n"] == {"sdpa": 15, "sage": 15} and m["fid"]["vs_baseline"]["sage"]["value"] > 0
    assert "unreliable" in m["fid"]["warning"]
    assert "std" in m["kid"]["vs_baseline"]["sage"]
    assert m["lpips"]["aggregate"]["sage"]["mean"] > 0


def test_identical_variants_give_perfect_fidelity(tmp_path, weights):
    run = make_synthetic_run(tmp_path / "same", frames=3, height=32, width=32, sigma=0.0)
    doc = evaluate(run, EvalOptions(metrics=["psnr", "ssim", "fid", "lpips"], inception_weights=weights["inception"],
                                    lpips_weights=weights["lpips"]), log=lambda s: None)
    m = doc["metrics"]
    assert m["psnr"]["aggregate"]["sage"]["mean"] == 100.0
    assert m["ssim"]["aggregate"]["sage"]["mean"] == pytest.approx(1.0)
    assert m["fid"]["vs_baseline"]["sage"]["value"] == pytest.approx(0.0, abs=1e-6)
    assert m["lpips"]["aggregate"]["sage"]["mean"] == pytest.approx(0.0, abs=1e-6)


def test_missing_weights_skip_only_that_metric_and_merge(run, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf"))
    monkeypatch.delenv("SAGEGEN_INCEPTION_WEIGHTS", raising=False)
    doc = evaluate(run, EvalOptions(metrics=["psnr"]), log=lambda s: None)
    assert doc["metrics"]["psnr"]["status"] == "ok"
    doc = evaluate(run, EvalOptions(metrics=["clipsim", "fid", "ssim"]), log=lambda s: None)
    m = doc["metrics"]
    assert m["clipsim"]["status"] == "skipped" and "--clip-model" in m["clipsim"]["reason"]
    assert "\n" not in m["clipsim"]["reason"]
    assert m["fid"]["status"] == "skipped" and "--inception-weights" in m["fid"]["reason"]
    assert m["ssim"]["status"] == "ok"
    assert m["psnr"]["status"] == "ok"  # kept from the first call


def test_a_missing_optional_package_skips_its_metrics_with_the_install_line(run):
    def no_open_clip():
        raise ModuleNotFoundError("No module named 'open_clip'", name="open_clip")

    doc = evaluate(run, EvalOptions(metrics=["clipsim", "psnr"], loaders={"clip": no_open_clip}), log=lambda s: None)
    m = doc["metrics"]
    assert m["clipsim"]["status"] == "skipped", m["clipsim"]
    assert "open_clip is not installed" in m["clipsim"]["reason"] and "sagegen[eval]" in m["clipsim"]["reason"]
    assert m["psnr"]["status"] == "ok"


def test_broken_weights_file_is_an_error_entry_not_a_crash(run, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"PK\x03\x04 a damaged torch.save zip")
    doc = evaluate(run, EvalOptions(metrics=["fid", "psnr"], inception_weights=str(bad)), log=lambda s: None)
    assert doc["metrics"]["fid"]["status"] == "error" and "could not load inception" in doc["metrics"]["fid"]["reason"]
    assert doc["metrics"]["psnr"]["status"] == "ok"
    # a file that is no weights file at all (text) is the option's mistake, named before any metric runs
    bad.write_bytes(b"not a model")
    with pytest.raises(BadOption, match="--inception-weights: .* not a PyTorch or safetensors weights file"):
        evaluate(run, EvalOptions(metrics=["fid", "psnr"], inception_weights=str(bad)), log=lambda s: None)


def test_image_run_clipscore_and_reference_folder(tmp_path, weights):
    from PIL import Image

    run = make_synthetic_run(tmp_path / "img", kind="image", height=48, width=48, prompts=["a", "b", "c"])
    ref = tmp_path / "ref"
    ref.mkdir()
    for i in range(4):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(ref / f"{i}.png")
    doc = evaluate(run, EvalOptions(metrics=["all", "clipsim"], clip_model=weights["clip"],
                                    inception_weights=weights["inception"], reference=ref), log=lambda s: None)
    m = doc["metrics"]
    assert m["clipsim"]["status"] == "skipped" and "video" in m["clipsim"]["reason"]
    assert m["clipscore"]["status"] == "ok" and m["clipscore"]["mode"] == "standard"
    assert set(m["fid"]["vs_reference"]) == {"sdpa", "sage"} and m["fid"]["n_reference"] == 4
    dv = m["fid"]["delta_vs_reference"]["sage"]["value"]
    assert dv == pytest.approx(m["fid"]["vs_reference"]["sage"]["value"] - m["fid"]["vs_reference"]["sdpa"]["value"])


def test_cli_defaults_to_latest_run_and_names_it(run, monkeypatch):
    monkeypatch.setenv("SAGEGEN_RUNS", str(run.parent))
    res = CliRunner().invoke(app(), ["eval", "--metric", "psnr", "--metric", "ssim"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert str(run) in res.output.replace("\n", "")
    assert "psnr" in res.output and "Wrote" in res.output
    assert (run / "metrics.json").is_file()


def test_cli_errors_name_the_option(run, monkeypatch, tmp_path):
    r = CliRunner().invoke(app(), ["eval", str(run), "--metric", "bogus"])
    assert r.exit_code == 2 and "--metric" in r.output and "clipsim" in r.output
    r = CliRunner().invoke(app(), ["eval", str(run), "-m", "clipsim", "--clip-mode", "fancy"])
    assert r.exit_code == 2 and "--clip-mode" in r.output and "evalcrafter" in r.output
    r = CliRunner().invoke(app(), ["eval", str(tmp_path / "nowhere"), "-m", "psnr"])
    assert r.exit_code == 2 and "manifest.json" in r.output
    r = CliRunner().invoke(app(), ["eval", str(run), "-m", "clipsim", "--clip-model", "ViT-Q-9/openai"])
    assert r.exit_code == 2 and "--clip-model" in r.output


def test_eval_run_dir_alone_computes_what_it_can(run, monkeypatch, tmp_path):
    """`sagegen eval RUN_DIR`, as compare's "Next:" line and report's note suggest: every metric it can,
    the others named with their reason, exit 0."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf"))
    for var in ("SAGEGEN_INCEPTION_WEIGHTS", "SAGEGEN_LPIPS_WEIGHTS", "SAGEGEN_CLIP_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("sagegen.eval.weights._alexnet_from_torch_cache", lambda: None)
    res = CliRunner().invoke(app(), ["eval", str(run)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "clipsim, clipt skipped: CLIP weights ViT-B-32/openai not found offline" in out
    assert "fid, kid skipped: no Inception weights" in out and "lpips skipped" in out
    assert "clipscore not applicable" in out
    doc = json.loads((run / "metrics.json").read_text())
    assert doc["metrics"]["psnr"]["status"] == "ok" and doc["metrics"]["ssim"]["status"] == "ok"
    assert doc["last_eval"]["computed"] == ["psnr", "ssim"]
    help_text = " ".join(CliRunner().invoke(app(), ["eval", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "[default: (all available)]" in help_text


def test_eval_exits_1_when_nothing_could_be_computed(run, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf"))
    monkeypatch.delenv("SAGEGEN_INCEPTION_WEIGHTS", raising=False)
    monkeypatch.delenv("SAGEGEN_CLIP_MODEL", raising=False)
    res = CliRunner().invoke(app(), ["eval", str(run), "-m", "fid,clipsim"], env={"COLUMNS": "200"})
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())
    assert "none of the requested metrics (fid, clipsim) could be computed" in out
    assert "fid skipped: no Inception weights" in out
    # an ok entry kept from an earlier call does not count as computed now
    CliRunner().invoke(app(), ["eval", str(run), "-m", "psnr"])
    monkeypatch.setattr("sagegen.eval.fidelity.psnr_frames", lambda a, b: 1 / 0)
    res = CliRunner().invoke(app(), ["eval", str(run), "-m", "psnr,fid"], env={"COLUMNS": "200"})
    assert res.exit_code == 1 and "psnr error: ZeroDivisionError" in " ".join(res.output.split())
