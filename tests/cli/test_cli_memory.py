"""Issue 54, defect 2: sizes that cannot fit are refused before any model loads (exit 2, naming the option),
the step count is capped, the --random-weights memory check keeps a margin, and float options refuse nan and
inf. The estimate (`sagegen.cli.memory`) rests on each preset's latent geometry (`sagegen.models.geometry`),
checked here against the full-size token counts and the latents of every tiny pipeline."""

import pytest
import torch
from typer.testing import CliRunner

from sagegen.cli import estimate, memory
from sagegen.cli.app import app
from sagegen.cli.checks import MAX_STEPS
from sagegen.models.geometry import arch_name, geometry
from sagegen.models.presets import PRESETS, resolve, tiny_presets

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

runner = CliRunner()
GiB = 2**30
H200 = 150_000_000_000  # what torch reports for an H200's total memory, about 140 GiB
FULL = [p for p in PRESETS.values() if not p.tiny]
TINY_VIDEO = [p.name for p in tiny_presets() if p.is_video]
TINY_IMAGE = [p.name for p in tiny_presets() if not p.is_video]


def _error(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def _command(command: str, model: str, tmp_path, *extra: str) -> list[str]:
    out = ["--out", str(tmp_path / ("calib.json" if command == "calibrate" else "run"))]
    quiet = [] if command == "calibrate" else ["-q", "--warmup", "0"]
    return [command, model, "-p", "x", "--steps", "2", *quiet, *out, *extra]  # (Mochi needs 2)


def _settings(preset, **changes) -> dict:
    return dict(preset.defaults(), vae_tiling=False, **changes)


# --- the step cap ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "compare", "calibrate"])
def test_steps_above_the_cap_are_refused_before_loading(fake_model, tmp_path, command):
    r = runner.invoke(app, [*_command(command, "tiny-cogvideox", tmp_path), "--steps", "100000000000"])
    assert r.exit_code == 2 and "--steps" in _error(r) and f"1 to {MAX_STEPS}" in _error(r)
    assert fake_model.loads == [] and not (tmp_path / "run").exists()


def test_steps_at_the_cap_still_run(fake_model, tmp_path):
    r = runner.invoke(app, [*_command("run", "tiny-flux", tmp_path), "--steps", str(MAX_STEPS)])
    assert r.exit_code == 0, r.output
    assert fake_model.calls[-1]["steps"] == MAX_STEPS


# --- sizes against the host -----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "compare", "calibrate"])
@pytest.mark.parametrize("model", TINY_VIDEO)
def test_frames_that_cannot_fit_the_host_are_refused_before_loading(fake_model, tmp_path, monkeypatch, command,
                                                                    model):
    """--frames 1000000 on tiny-cogvideox grew to 17 GiB in 60 s on a 24 GiB machine."""
    monkeypatch.setattr(estimate, "available_bytes", lambda: 16 * GiB)
    monkeypatch.setattr(memory, "gpu_bytes", lambda device: None)
    r = runner.invoke(app, [*_command(command, model, tmp_path), "--frames", "1000000", "--device", "cpu"])
    line = _error(r)
    assert r.exit_code == 2 and line.startswith("Error: --frames:") and "host memory" in line, line
    assert "16.0 GiB available" in line and "frames kept for saving" in line and "at most about" in line
    assert fake_model.loads == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("model", TINY_IMAGE + ["tiny-cogvideox"])
def test_height_and_width_that_cannot_fit_are_refused_before_loading(fake_model, tmp_path, monkeypatch,
                                                                     model):
    """--height 100000 --width 100000 gave an OverflowError after the model load (exit 1)."""
    monkeypatch.setattr(estimate, "available_bytes", lambda: 16 * GiB)
    r = runner.invoke(app, [*_command("run", model, tmp_path), "--height", "100000", "--width", "100000",
                            "--device", "cpu"])
    line = _error(r)
    assert r.exit_code == 2 and line.startswith("Error: --height/--width:") and "host memory" in line, line
    assert fake_model.loads == []


def test_the_largest_frame_count_suggested_fits_and_one_more_step_does_not(monkeypatch):
    monkeypatch.setattr(estimate, "available_bytes", lambda: 4 * GiB)
    preset = resolve("tiny-cogvideox")
    problem = memory.fit_problem(preset, _settings(preset, frames=400_001), on_gpu=False, given=("--frames",))
    assert problem is not None and problem[1] == "--frames"
    most = int(problem[0].split("at most about ")[1].split()[0])
    assert (most - 1) % preset.frame_step == 0
    assert memory.fit_problem(preset, _settings(preset, frames=most), on_gpu=False) is None
    assert memory.fit_problem(preset, _settings(preset, frames=most + preset.frame_step), on_gpu=False)


@pytest.mark.parametrize("model", [p.name for p in tiny_presets()])
def test_every_tiny_preset_at_its_defaults_fits_a_small_machine(monkeypatch, model):
    monkeypatch.setattr(estimate, "available_bytes", lambda: 1 * GiB)
    preset = resolve(model)
    need = memory.needs(preset, _settings(preset), on_gpu=False, variants=("sdpa", "sage"))
    assert sum(need.host.values()) < 1 * GiB
    assert memory.fit_problem(preset, _settings(preset), on_gpu=False, variants=("sdpa", "sage")) is None


# --- sizes against the GPU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", FULL, ids=lambda p: p.name)
def test_every_full_size_preset_at_its_defaults_fits_an_h200(monkeypatch, preset):
    """Real sizes stay allowed: Wan 14B at 720p x 81 frames, HunyuanVideo at 720p x 129, both Wan2.2 experts."""
    monkeypatch.setattr(memory, "gpu_bytes", lambda device: H200)
    settings = _settings(preset)
    assert memory.fit_problem(preset, settings, on_gpu=True, variants=("sdpa", "sage")) is None
    need = memory.needs(preset, settings, on_gpu=True, variants=("sdpa", "sage"),
                        weights=memory.known_weights(preset, settings, random_weights=False, model_path=None))
    assert any("weights" in part for part in need.device)  # every full-size preset's transformer is sized
    assert sum(need.device.values()) < 80 * GiB  # (also an 80 GB GPU)


def test_a_video_too_long_for_the_gpu_is_refused_naming_frames(monkeypatch):
    monkeypatch.setattr(memory, "gpu_bytes", lambda device: H200)
    preset = resolve("wan2.1-t2v-14b")
    message, option = memory.fit_problem(preset, _settings(preset, frames=100_001), on_gpu=True,
                                         given=("--frames",))
    assert option == "--frames" and "GPU memory" in message and "at most about" in message
    assert "--vae-tiling" in message and "--cp" in message
    # CP splits the sequence: four GPUs hold the activations of a longer video
    one = memory.needs(preset, _settings(preset, frames=801), on_gpu=True)
    four = memory.needs(preset, _settings(preset, frames=801), on_gpu=True, cp_world=4)
    assert four.device["activations"] * 3 < one.device["activations"]


def test_weights_beyond_the_gpu_name_offload_and_offloaded_weights_count_on_the_host(monkeypatch):
    monkeypatch.setattr(memory, "gpu_bytes", lambda device: 48 * GiB)
    preset = resolve("wan2.2-t2v-a14b")  # two 14B experts: 53 GiB of bf16 weights
    message, option = memory.fit_problem(preset, _settings(preset), on_gpu=True)
    assert option == "--offload" and "--offload model" in message
    assert memory.fit_problem(preset, _settings(preset), on_gpu=True, offload="model") is None
    monkeypatch.setattr(estimate, "available_bytes", lambda: 32 * GiB)
    message, option = memory.fit_problem(preset, _settings(preset), on_gpu=True, offload="model")
    assert "host memory" in message and "weights" in message


def test_a_local_model_path_is_not_sized_by_the_presets_config(monkeypatch):
    preset = resolve("wan2.2-t2v-a14b")
    assert memory.known_weights(preset, _settings(preset), random_weights=False, model_path="/x") == {}


# --- --random-weights on the CPU ------------------------------------------------------------------------------
def test_random_weights_check_keeps_a_margin_for_the_vae_activations_and_the_process(monkeypatch):
    """flux.1-dev's 22.2 GiB of weights started with ~22 GiB available: now the VAE, the activations, the frames
    and the process are counted as well."""
    preset = resolve("flux.1-dev")
    weights = estimate.transformer_bytes(preset, "bfloat16")
    monkeypatch.setattr(estimate, "available_bytes", lambda: weights + GiB // 2)
    problem = memory.memory_problem(preset, {"dtype": "bfloat16"})
    assert problem is not None and "22.2 GiB" in problem and "the process" in problem
    assert "the full-size VAE" in problem and "activations" in problem
    monkeypatch.setattr(estimate, "available_bytes", lambda: weights + 4 * GiB)
    assert memory.memory_problem(preset, {"dtype": "bfloat16"}) is None


def test_random_weights_count_both_experts_of_wan22(monkeypatch):
    preset = resolve("wan2.2-t2v-a14b")
    one = estimate.transformer_bytes(preset, "bfloat16")
    weights = memory.known_weights(preset, _settings(preset), random_weights=True, model_path=None)
    assert weights[f"{preset.name}'s transformer weights (bfloat16)"] == 2 * one
    assert 0.2 * GiB < weights["the full-size VAE"] < 1 * GiB  # Wan2.1's VAE, 127M float32 parameters


def test_random_weights_too_large_for_the_cpu_name_the_option_through_the_cli(fake_model, tmp_path,
                                                                              monkeypatch):
    preset = resolve("flux.1-dev")
    monkeypatch.setattr(estimate, "available_bytes", lambda: estimate.transformer_bytes(preset, "bfloat16") + GiB)
    r = runner.invoke(app, ["run", "flux.1-dev", "--random-weights", "-p", "x", "--device", "cpu", "-q",
                            "--steps", "1", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and _error(r).startswith("Error: --random-weights:") and "the process" in r.output
    assert fake_model.loads == []


# --- float options: nan and inf -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
@pytest.mark.parametrize("command", ["run", "compare", "calibrate"])
def test_guidance_must_be_a_finite_number(fake_model, tmp_path, command, value):
    r = runner.invoke(app, [*_command(command, "tiny-flux", tmp_path), "--guidance", value])
    line = _error(r)
    assert r.exit_code == 2 and "--guidance" in line and "finite number >= 0" in line, line
    assert fake_model.loads == []


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0.5", "256"])
def test_report_gain_must_be_a_finite_number_from_1_to_255(tmp_path, value):
    r = runner.invoke(app, ["report", str(tmp_path), "--gain", value])
    line = _error(r)
    assert r.exit_code == 2 and "--gain" in line and "finite number from 1 to 255" in line, line


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_calibrate_target_must_be_a_finite_number(fake_model, tmp_path, value):
    r = runner.invoke(app, [*_command("calibrate", "tiny-flux", tmp_path), "--target", value])
    assert r.exit_code == 2 and "--target" in _error(r) and "finite number" in _error(r)


# --- the geometry under the estimate --------------------------------------------------------------------------
@pytest.mark.parametrize("preset", FULL, ids=lambda p: p.name)
def test_geometry_gives_the_full_size_token_counts(preset):
    from sagegen.models.arch import tokens_per_sample

    g = geometry(preset)
    for scale in (1, 2):
        h, w = preset.height * scale, preset.width * scale
        frames = preset.frames * scale + 1 if preset.is_video else None
        assert g.tokens(h, w, frames) + g.text_tokens == tokens_per_sample(arch_name(preset), height=h, width=w,
                                                                           frames=frames)


@pytest.mark.parametrize("model", [p.name for p in tiny_presets()])
def test_geometry_gives_each_tiny_pipelines_latents_and_frames(model):
    """The tiny VAEs compress other than the released ones (LTX and Qwen-Image 4x): the estimate follows the
    pipelines that really run, at a size other than the default."""
    from sagegen.jobs.generate import call_kwargs
    from sagegen.models.loading import load

    preset = resolve(model)
    g = geometry(preset)
    h, w = 2 * preset.size_multiple * 2, 3 * preset.size_multiple * 2
    frames = 2 * preset.frame_step + 1 if preset.is_video else None
    settings = _settings(preset, height=h, width=w, frames=frames, steps=max(2, getattr(preset, "min_steps", 1)))
    pipe = load(preset, dtype="float32", device="cpu").pipe
    seen = []
    pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"]).shape),
        with_kwargs=True)
    with torch.inference_mode():
        out = pipe(**call_kwargs(preset, settings, "a cat"), output_type="np",
                   generator=torch.Generator().manual_seed(0))
    lf, lh, lw = g.latent_grid(h, w, frames)
    shape = seen[0]
    channels = pipe.transformer.config.in_channels // (4 if preset.family in ("flux", "qwenimage") else 1)
    assert shape.numel() == shape[0] * channels * lf * lh * lw, (shape, g)
    assert shape[0] <= g.cfg_batch
    arr = out.frames[0] if preset.is_video else out.images
    assert tuple(arr.shape[-3:-1]) == (h, w) and (len(arr) if preset.is_video else 1) == g.frames_out(frames)
