"""Issue 22, "in the way": line-based progress without a terminal, the CPU time warning, the run-dir lock."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sagegen.runs import lock as runlock
from sagegen.cli.app import app
from sagegen.cli.progress import LineReporter, RichReporter, make_reporter
from sagegen.jobs.generate import Sample
from sagegen.models.presets import resolve

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_not_a_terminal_gets_one_line_per_sample(fake_model, tmp_path):
    r = runner.invoke(app, ["compare", "tiny-flux", "-p", "a", "-p", "b", "--steps", "2", "--warmup", "0",
                            "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    for variant in ("sdpa", "sage"):
        for i, sid in enumerate(("p000-s0", "p001-s0"), start=1):
            assert f"{variant} {i}/2 {sid}: started (2 steps)" in r.output
            done = [ln for ln in r.output.splitlines()
                    if ln.startswith(f"{variant} {i}/2 {sid}: ") and " s (denoise" in ln]
            assert len(done) == 1, r.output
    assert "\r" not in r.output and "sdpa samples" not in r.output  # no progress bars


def test_reporter_choice():
    tty = Console(file=io.StringIO(), force_terminal=True)
    pipe = Console(file=io.StringIO(), force_terminal=False)
    assert isinstance(make_reporter(tty, quiet=False, rank=0), RichReporter)
    for console, quiet, rank in ((pipe, False, 0), (tty, True, 0), (tty, False, 1)):
        rep = make_reporter(console, quiet=quiet, rank=rank)
        assert isinstance(rep, LineReporter) and not isinstance(rep, RichReporter)


def test_long_samples_get_step_lines(monkeypatch):
    out = io.StringIO()
    rep = LineReporter(Console(file=out, force_terminal=False, width=200), rank=1)
    clock = iter([0.0, 10.0, 31.0, 40.0, 70.0])  # sample start, then one reading per step
    monkeypatch.setattr("sagegen.cli.progress.time.monotonic", lambda: next(clock))
    rep.variant_start("sage", 1, 1)
    rep.sample_start("sage", Sample("p000-s0", "a", 0), 50)
    for done in (1, 2, 3, 4):
        rep.step(done, 50)
    lines = out.getvalue().splitlines()
    assert lines == ["[rank 1] sage 1/1 p000-s0: started (50 steps)", "[rank 1] sage 1/1 p000-s0: step 2/50, 31 s",
                     "[rank 1] sage 1/1 p000-s0: step 4/50, 70 s"]


def test_random_weights_on_cpu_warns_with_an_estimate(fake_model, tmp_path, monkeypatch):
    from sagegen.cli import estimate

    monkeypatch.setattr(estimate, "available_bytes", lambda: 2**40)  # (the fake model needs none)
    r = runner.invoke(app, ["run", "flux.1-dev", "--random-weights", "-p", "x", "--device", "cpu", "-q",
                            "--steps", "1", "--warmup", "0", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("warning: --random-weights"))
    assert "flux.1-dev" in line and "per sample" in line and "GFLOP/s" in line
    assert r.output.index("warning: --random-weights") < r.output.index("sage 1/1 p000-s0:")  # before the work


def test_random_weights_that_cannot_fit_in_memory_are_refused_before_loading(fake_model, tmp_path,
                                                                             monkeypatch):
    """Flux's 11.9B-parameter transformer is 22.2 GiB of bf16 weights: on a machine with less memory the run
    was killed minutes later (exit 137); now it is a usage error naming the sizes, before anything loads."""
    from sagegen.cli import estimate, memory

    need = estimate.transformer_bytes(resolve("flux.1-dev"), "bfloat16")
    assert 23.5e9 < need < 24.0e9  # 11.90B parameters, counted on the meta device
    monkeypatch.setattr(estimate, "available_bytes", lambda: 16 * 2**30)
    r = runner.invoke(app, ["run", "flux.1-dev", "--random-weights", "-p", "x", "--device", "cpu", "-q",
                            "--steps", "1", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "--random-weights" in r.output and "22.2 GiB" in r.output, r.output
    assert "16.0 GiB available" in r.output and fake_model.loads == [] and not (tmp_path / "run").exists()
    assert memory.memory_problem(resolve("tiny-flux"), {"dtype": "bfloat16"}) is None  # no full-size arch


def test_lock_refuses_a_second_writer_and_is_released(tmp_path):
    run = tmp_path / "run"
    with runlock.hold(run, ["sagegen", "run", "x"]) as path:
        owner = json.loads(path.read_text())
        assert owner["pid"] == os.getpid() and owner["command"] == ["sagegen", "run", "x"]
        # another process: flock is per open file, so a child sees the lock as taken
        code = f"from sagegen.runs import lock as runlock\nwith runlock.hold({str(run)!r}): pass"
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "RunDirBusy" in r.stderr and f"pid {os.getpid()}" in r.stderr
    assert not path.exists()
    with runlock.hold(run):  # released: can be taken again
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_stale_lock_file_is_taken_over(tmp_path):
    """A lock file left by a killed process (its flock died with it) does not block the next run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / runlock.LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "gone"}))
    with runlock.hold(run) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_cli_says_which_process_holds_the_run(fake_model, tmp_path):
    run = tmp_path / "run"
    code = ("import time\nfrom sagegen.runs import lock as runlock\n"
            f"with runlock.hold({str(run)!r}, ['sagegen', 'compare']):\n"
            "    print('held', flush=True)\n    time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = runner.invoke(app, ["run", "tiny-flux", "-p", "x", "--steps", "1", "--warmup", "0", "-q",
                                "--out", str(run)])
        assert r.exit_code == 2 and f"pid {holder.pid}" in r.output and "another --out" in r.output
        assert fake_model.loads == [] and not (run / "manifest.json").exists()
    finally:
        holder.kill()
        holder.wait()
    r = runner.invoke(app, ["run", "tiny-flux", "-p", "x", "--steps", "1", "--warmup", "0", "-q", "--out", str(run)])
    assert r.exit_code == 0, r.output  # the killed holder's lock is stale
