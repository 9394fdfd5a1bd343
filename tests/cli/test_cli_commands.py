"""Every sagegen command and error path through typer's CliRunner (fast: no model is run here)."""

import json
import time

import diffusers
import pytest
import typer
from typer.testing import CliRunner

from sagegen.cli import app as app_module
from sagegen.cli.app import app, register_commands
from sagegen.models import loading
from sagegen.models.presets import resolve

runner = CliRunner()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No real HF cache, no network, runs under tmp, no debug from the outside."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("SAGEGEN_DEBUG", raising=False)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)


def _one_error_line(result):
    lines = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_help_lists_every_command():
    r = runner.invoke(app, [])  # no arguments: the help, no error line (exit 2 as click does)
    assert r.exit_code == 2 and "Usage" in r.output and "Error" not in r.output
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for cmd in ("run", "compare", "models", "env"):
        assert cmd in r.output
    for cmd in ("run", "compare", "models", "env"):
        assert runner.invoke(app, [cmd, "--help"]).exit_code == 0


USAGE_ERRORS = [
    (["run", "cogvidx", "--prompt", "a"], "unknown model 'cogvidx'; did you mean"),
    (["run", "tiny", "--prompt", "a", "--seed", "x"], "--seed"),
    (["run", "tiny", "--prompt", "a", "--attention", "foo"], "'--attention'"),
    (["run", "tiny"], "--prompt"),
    (["run", "tiny", "--prompt", ""], "empty prompt"),
    (["run", "tiny-flux", "--prompt", "a", "--frames", "9"], "--frames"),
    (["run", "tiny", "--prompt", "a", "--height", "30"], "--height 30 must be a positive multiple of 16"),
    (["run", "tiny", "--prompt", "a", "--steps", "0"], "'--steps'"),
    (["run", "tiny", "--prompt", "a", "--offload", "model", "--device", "cpu"], "--offload"),
    (["run", "tiny", "--prompt", "a", "--random-weights"], "--random-weights"),
    (["run", "cogvideox", "--prompt", "a", "--random-weights", "--model-path", "."], "--random-weights"),
    (["run", "tiny", "--prompt", "a", "--kernel", "pv_precision=fp4"], "--kernel"),
    (["run", "tiny", "--prompt", "a", "--dtype", "int8"], "'--dtype'"),
    (["compare", "tiny", "--prompts", "no-such-set"], "--prompts"),
    (["compare", "tiny", "--prompt", "a", "--fp-first-steps", "-1"], "'--fp-first-steps'"),
    (["run", "tiny", "--prompt", "a", "--device", "tpu"], "--device"),
    (["bogus"], "No such command"),
    (["run", "tiny", "--prompt", "a", "--nope"], "No such option"),
]


@pytest.mark.parametrize("args, expected", USAGE_ERRORS, ids=[" ".join(a[:1] + a[2:])[:40] for a, _ in USAGE_ERRORS])
def test_usage_errors_exit_2_with_one_line(args, expected, tmp_path):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert expected in _one_error_line(r)
    assert not (tmp_path / "runs").exists()  # nothing written for a bad command line


def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # conftest sets it for the kernel tests
    r = runner.invoke(app, ["run", "tiny", "--prompt", "a", "--device", "cpu", "--backend", "triton"])
    assert r.exit_code == 2 and "--backend" in _one_error_line(r) and "TRITON_INTERPRET=1" in r.output
    assert not (tmp_path / "runs").exists()


def test_cuda_device_without_gpu_is_a_usage_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    r = runner.invoke(app, ["run", "tiny", "--prompt", "a", "--device", "cuda:1"])
    assert r.exit_code == 2 and "no CUDA GPU" in _one_error_line(r)


def test_model_path_must_be_a_pipeline_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (empty, tmp_path / "missing"):
        r = runner.invoke(app, ["run", "cogvideox", "--prompt", "a", "--model-path", str(path)])
        assert r.exit_code == 2
        line = _one_error_line(r)
        assert "--model-path" in line and "model_index.json" in line
    r = runner.invoke(app, ["run", "tiny", "--prompt", "a", "--model-path", str(empty)])
    assert r.exit_code == 2 and "built in" in _one_error_line(r)


def test_missing_weights_fail_fast_offline(tmp_path):
    t0 = time.perf_counter()
    r = runner.invoke(app, ["run", "cogvideox", "--prompt", "a fox"])
    assert time.perf_counter() - t0 < 15
    assert r.exit_code == 1
    line = _one_error_line(r)
    assert "THUDM/CogVideoX-2b" in line and "HF_HUB_OFFLINE=1" in line
    assert "hf download THUDM/CogVideoX-2b" in line and "huggingface-cli download" in line
    assert "--model-path" in line
    assert not (tmp_path / "runs").exists()  # a failed load leaves no empty run directory


def test_missing_weights_fail_fast_when_hub_unreachable(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: refused at once
    t0 = time.perf_counter()
    r = runner.invoke(app, ["compare", "flux-dev", "--prompt", "a"])
    assert time.perf_counter() - t0 < 15
    assert r.exit_code == 1
    line = _one_error_line(r)
    assert "hub is unreachable" in line and "127.0.0.1:9" in line
    assert "accept the licence" in line  # FLUX.1-dev is gated


def test_hub_probe_gives_up_within_its_timeout(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://192.0.2.1")  # TEST-NET-1: never answers
    # the tests are offline (conftest.py): a connection that never answers, without sending anything
    class Silent:  # what a connection that never answers looks like from the probe's thread
        def __init__(self, *a, **k):
            time.sleep(10)

        def close(self):
            pass

    monkeypatch.setattr(loading.socket, "create_connection", Silent)
    t0 = time.perf_counter()
    ok, why = loading.hub_reachable(timeout=1.0)
    assert not ok and "192.0.2.1" in why
    assert time.perf_counter() - t0 < 3


def test_debug_flag_and_env_show_the_exception(monkeypatch):
    """--debug adds the traceback but keeps the one-line error and the exit code (issue 22, bug 5)."""
    plain = runner.invoke(app, ["run", "cogvideox", "--prompt", "a"])
    assert plain.exit_code == 1 and "Traceback" not in plain.output
    for args in (["run", "cogvideox", "--prompt", "a", "--debug"], ["--debug", "run", "cogvideox", "--prompt", "a"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 1 and "Traceback" in r.output and "WeightsUnavailable" in r.output
    monkeypatch.setenv("SAGEGEN_DEBUG", "1")
    r = runner.invoke(app, ["run", "cogvideox", "--prompt", "a"])
    assert r.exit_code == 1 and "Traceback" in r.output
    r = runner.invoke(app, ["run", "cogvidx", "--prompt", "a"])  # a usage error stays exit 2 under debug
    assert r.exit_code == 2 and "did you mean" in r.output


def test_unexpected_errors_are_one_line_with_a_debug_hint(monkeypatch):
    import sagegen.jobs.generate

    def boom(*a, **k):
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr(sagegen.jobs.generate, "run_job", boom)
    r = runner.invoke(app, ["run", "tiny", "--prompt", "a"])
    assert r.exit_code == 1
    line = _one_error_line(r)
    assert "ZeroDivisionError: division by zero" in line and "--debug" in line and "second line" not in line


def test_keyboard_interrupt_exits_130(monkeypatch):
    import sagegen.jobs.generate

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sagegen.jobs.generate, "run_job", interrupted)
    r = runner.invoke(app, ["compare", "tiny", "--prompt", "a"])
    assert r.exit_code == 130 and "resumes" in _one_error_line(r)


def test_sigterm_unwinds_like_ctrl_c_and_removes_an_unfinished_run_dir(tmp_path):
    """`timeout` and job schedulers send SIGTERM: the run stops with exit 143 and the same cleanup as Ctrl-C (a
    run directory this run created, with no finished sample, is removed), in a real process."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "new" / "run"
    proc = subprocess.Popen([sys.executable, "-m", "sagegen", "run", "tiny-flux", "--prompt", "a", "--steps", "1000",
                             "--device", "cpu", "--out", str(out)], stderr=subprocess.PIPE, text=True,
                            env={**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},  # (faster)
                                 "PYTHONUNBUFFERED": "1"})
    lines = []
    try:
        for line in proc.stderr:  # the denoising loop has started once the sample says so
            lines.append(line)
            if "started" in line:
                break
        assert out.is_dir(), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert proc.returncode == 143, "".join(lines) + rest
    assert "terminated (SIGTERM)" in rest and "Traceback" not in rest
    assert not (tmp_path / "new").exists()  # removed up to the first folder the run created


def test_sigterm_handler_is_restored_after_a_command():
    import signal

    from sagegen.cli.errors import cli_command

    before = signal.getsignal(signal.SIGTERM)
    assert cli_command(lambda: signal.getsignal(signal.SIGTERM))() is not before
    assert signal.getsignal(signal.SIGTERM) is before


def _fake_cache(root, repo, components=("scheduler", "transformer", "vae")):
    snap = root / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    index = {"_class_name": "CogVideoXPipeline", "scheduler": ["diffusers", "X"], "transformer": ["diffusers", "Y"],
             "vae": ["diffusers", "Z"], "text_encoder": [None, None]}
    (snap / "model_index.json").write_text(json.dumps(index))
    for c in components:
        (snap / c).mkdir()
    return snap


def test_models_lists_presets_and_local_weights(tmp_path):
    _fake_cache(tmp_path / "hf", "THUDM/CogVideoX-2b")
    _fake_cache(tmp_path / "hf", "zai-org/CogVideoX-5b", components=("scheduler",))  # renamed org, partial
    r = runner.invoke(app, ["models", "--json"])
    assert r.exit_code == 0
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert rows["cogvideox-2b"]["weights"] == "cached"
    assert rows["cogvideox-5b"]["weights"] == "partial"
    assert rows["mochi-1"]["weights"] == "not downloaded"
    assert rows["tiny-mochi"]["weights"] == "built-in"
    assert rows["flux.1-schnell"]["steps"] == 4 and rows["flux.1-schnell"]["guidance"] == 0.0
    assert rows["cogvideox-2b"]["hub_id"] == "THUDM/CogVideoX-2b" and rows["cogvideox-2b"]["frames"] == 49
    r = runner.invoke(app, ["models", "--verbose"])
    assert r.exit_code == 0
    for text in ("cogvideox1.5-5b", "THUDM/CogVideoX1.5-5B", "1360x768", "built-in", "cached", "not usable"):
        assert text in r.output
    # piped (not a terminal), even at 80 columns: whole cells, no "…"
    r = runner.invoke(app, ["models"], env={"COLUMNS": "80"})
    table = [line for line in r.output.splitlines() if line.startswith(("┃", "│"))]
    assert "frames@fps" in table[0] and "guidance" in table[0] and not any("…" in line for line in table)
    assert any("hunyuanvideo-1.5" in line and "not downloaded" in line for line in table), r.output


def test_cached_weights_are_located_without_network(tmp_path):
    snap = _fake_cache(tmp_path / "hf", "THUDM/CogVideoX-2b")
    where, local_only, source = loading.locate(resolve("cogvideox-2b"), None)
    assert where == str(snap) and local_only and "cache" in source


def test_env_reports_versions_and_kernel_choice():
    r = runner.invoke(app, ["env", "--json"])
    assert r.exit_code == 0
    info = json.loads(r.output)
    assert info["versions"]["torch"] and info["versions"]["sagegen"]
    assert info["cpu_kernel"]["variant"] == "reference" and "compute capability" in info["cpu_kernel"]["why"]
    assert info["huggingface"]["offline"] is True
    for gpu in info["gpus"]:
        assert gpu["kernel"]["variant"] in ("triton", "sdpa", "reference", "error") and gpu["kernel"]["why"]
    support = info["integrations"]
    assert support["attention_backend"]["ok"] and "'sagegen' registered" in support["attention_backend"]["detail"]
    assert support["context_parallel"] == {"ok": True, "detail": f"diffusers {diffusers.__version__}: Ulysses, "
                                                                 "Ring, both"}
    assert support["video_encoder"]["ok"] and "ffmpeg" in support["video_encoder"]["detail"]
    r = runner.invoke(app, ["env"])
    assert r.exit_code == 0 and "attention kernel" in r.output and "diffusers integration" in r.output


def test_env_says_what_an_install_lacks(monkeypatch):
    """No ffmpeg, no CP in diffusers: `sagegen env` says so (and still exits 0)."""
    import sagegen.runs.encode

    def missing():
        raise ModuleNotFoundError("No module named 'imageio_ffmpeg'", name="imageio_ffmpeg")

    monkeypatch.setattr(sagegen.runs.encode, "ffmpeg_exe", missing)
    monkeypatch.delattr(diffusers.ModelMixin, "enable_parallelism")
    r = runner.invoke(app, ["env", "--json"])
    assert r.exit_code == 0
    support = json.loads(r.output)["integrations"]
    assert not support["video_encoder"]["ok"] and "pip install imageio-ffmpeg" in support["video_encoder"]["detail"]
    assert not support["context_parallel"]["ok"] and "no context parallelism" in support["context_parallel"]["detail"]
    r = runner.invoke(app, ["env"])
    assert r.exit_code == 0 and "imageio_ffmpeg" in r.output


def test_env_check_hub_is_quick(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.perf_counter()
    r = runner.invoke(app, ["env", "--check-hub", "--json"])
    assert r.exit_code == 0 and time.perf_counter() - t0 < 10
    assert json.loads(r.output)["huggingface"]["hub"]["reachable"] is False


def test_command_registry_skips_missing_and_stands_in_for_broken(monkeypatch):
    real = app_module.importlib.import_module

    def fake_import(name):
        if name.endswith("ghost_cmd"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if name.endswith("broken_cmd"):
            raise RuntimeError("kaput")
        return real(name)

    monkeypatch.setattr(app_module.importlib, "import_module", fake_import)
    target = typer.Typer(cls=app_module.SagegenGroup)
    done = register_commands(target, ("models_cmd", "ghost_cmd", "broken_cmd"))
    assert done == ["models_cmd", "broken_cmd"]
    r = runner.invoke(target, ["broken"])
    assert r.exit_code == 1 and "kaput" in _one_error_line(r)
    assert runner.invoke(target, ["ghost"]).exit_code == 2


def test_entry_point_fails_fast_with_an_empty_cache(tmp_path):
    """A real process (import time included), HF_HUB_CACHE at an empty folder, no usable network."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SAGEGEN_"))}
    env.update(HF_HUB_CACHE=str(tmp_path / "empty-cache"), HF_ENDPOINT="http://127.0.0.1:9",
               SAGEGEN_RUNS=str(tmp_path / "runs"))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sagegen.cli.app", "run", "mochi", "--prompt", "a"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert time.perf_counter() - t0 < 30
    assert proc.returncode == 1, proc.stderr
    assert "genmo/mochi-1-preview" in proc.stderr and "empty-cache" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert [ln.startswith("Error:") for ln in proc.stderr.splitlines()].count(True) == 1


def test_env_names_the_auto_crossover_on_a_gpu(monkeypatch):
    import torch

    from sagegen.cli import env_cmd
    from sagegen.kernels import dispatch as backends

    monkeypatch.setattr(backends, "describe_cuda", lambda device: (True, "compute capability 9.0"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    choice = env_cmd.kernel_choice(torch.device("cuda", 0))
    assert choice["variant"] == "triton" and "FP8" in choice["detail"] and "Gluon" in choice["detail"]
    assert backends.crossover_note() in choice["why"] and "SDPA" in choice["why"]
    assert choice["auto_min_work"] == backends.AUTO_MIN_WORK
