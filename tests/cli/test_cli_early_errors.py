"""Issue 54, defect 8 and the low items: usage errors found at once, named, before any model loads.

Each was found late (after the load or the work) or reached the user as a traceback-like line: calibrate
--out DIR, tiny-mochi --steps 1, --model-path of another pipeline / invalid JSON / a file, a full disk at
start, --clip-model on a text file, an empty blocks= in a sparse spec, the API's sparse= errors naming the CLI
option, bench's argparse usage block. Also: a fixed `<name>.tmp` as a temporary file, and shell completion of
MODEL.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _error(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output and "usage:" not in result.output
    return " ".join(result.output[result.output.index("Error:"):].split())


# ------------------------------------------------------------------------------------------ calibrate --out
def test_calibrate_out_folder_is_refused_before_any_work(fake_model, tmp_path):
    folder = tmp_path / "calibs"
    folder.mkdir()
    for out, why in ((folder, "is a folder"), (tmp_path / "file.txt" / "c.json", "is a file, not a folder")):
        (tmp_path / "file.txt").write_text("x")
        r = runner.invoke(app, ["calibrate", "tiny-flux", "-p", "a", "--out", str(out)])
        assert r.exit_code == 2 and "--out" in _error(r) and why in _error(r), r.output
    assert fake_model.loads == []  # nothing loaded, nothing calibrated
    assert list(folder.iterdir()) == []


def test_calibration_file_is_written_through_a_unique_temporary(tmp_path, monkeypatch):
    """Not `<out>.tmp`: another writer's file of that name is left alone, and a failed write leaves nothing."""
    from sagegen.runs import files as runfiles
    from sagegen.sparse.sparse_config import SparseConfig
    from sagegen.sparse.text import load_calibration, save_calibration

    out = tmp_path / "calib.json"
    (tmp_path / "calib.json.tmp").write_text("someone else's")
    save_calibration(out, SparseConfig(mode="cdf", value=0.9), {"model": "tiny-flux"})
    assert load_calibration(out)["value"] == 0.9
    assert (tmp_path / "calib.json.tmp").read_text() == "someone else's"

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runfiles, "_umask_mode", no_space)
    with pytest.raises(runfiles.WriteError, match="no space left"):
        save_calibration(tmp_path / "other.json", SparseConfig(), {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.json", "calib.json.tmp"]


def test_no_module_writes_through_a_fixed_tmp_name():
    """Every atomic write goes through sagegen.runs.files (mkstemp beside the target): a fixed `X.tmp` would be
    shared by two writers and left behind by a failed one."""
    fixed = re.compile(r"""["']\.tmp["']|\+\s*["']\.tmp|\.tmp["']\s*\+""")
    found = [f"{p.relative_to(ROOT)}:{i}" for folder in ("sagegen", "bench") for p in (ROOT / folder).rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if fixed.search(line)]
    assert not found, f"fixed temporary names: {found}"


# ------------------------------------------------------------------------------------------ --steps
@pytest.mark.parametrize("model", ["tiny-mochi", "mochi-1"])
def test_too_few_steps_for_the_scheduler_is_a_usage_error(model, fake_model):
    r = runner.invoke(app, ["run", model, "-p", "a", "--steps", "1"])
    assert r.exit_code == 2, r.output
    assert "--steps 1" in _error(r) and "at least 2" in _error(r)
    assert fake_model.loads == []


def test_every_preset_takes_its_default_and_its_minimum_steps():
    from sagegen.models.presets import PRESETS, check_shape

    for p in PRESETS.values():
        for steps in (p.steps, p.min_steps):
            errors, _ = check_shape(p, height=p.height, width=p.width, frames=p.frames, steps=steps)
            assert not errors, (p.name, steps, errors)
        errors, _ = check_shape(p, height=p.height, width=p.width, frames=p.frames, steps=p.min_steps - 1)
        assert p.min_steps == 1 or errors


# ------------------------------------------------------------------------------------------ --model-path
def _pipeline_folder(root: Path, class_name: str | None, components=("vae",), text: str | None = None) -> Path:
    root.mkdir(parents=True)
    spec = {"vae": ["diffusers", "AutoencoderKL"]} | ({"_class_name": class_name} if class_name else {})
    (root / "model_index.json").write_text(text if text is not None else json.dumps(spec))
    for c in components:
        (root / c).mkdir()
    return root


@pytest.mark.parametrize("case,why", [
    ("other_class", "holds a FluxPipeline"),
    ("invalid_json", "not valid JSON"),
    ("not_an_object", "not a JSON object"),
    ("a_file", "is a file, not a folder"),
    ("the_index_file", "give its folder"),
    ("missing", "does not exist"),
    ("partial", "missing: vae"),
    ("no_index", "has no model_index.json"),
])
@pytest.mark.parametrize("command", ["run", "calibrate"])
def test_model_path_problems_are_named_before_loading(case, why, command, fake_model, tmp_path):
    root = tmp_path / "m"
    path = {
        "other_class": lambda: _pipeline_folder(root, "FluxPipeline"),
        "invalid_json": lambda: _pipeline_folder(root, None, text="{oops"),
        "not_an_object": lambda: _pipeline_folder(root, None, text="[1]"),
        "a_file": lambda: (tmp_path / "notes.txt", (tmp_path / "notes.txt").write_text("x"))[0],
        "the_index_file": lambda: _pipeline_folder(root, "CogVideoXPipeline") / "model_index.json",
        "missing": lambda: tmp_path / "nowhere",
        "partial": lambda: _pipeline_folder(root, "CogVideoXPipeline", components=()),
        "no_index": lambda: (root.mkdir(), root)[1],
    }[case]()
    r = runner.invoke(app, [command, "cogvideox", "-p", "a", "--model-path", str(path)])
    assert r.exit_code == 2, r.output
    assert "--model-path" in _error(r) and why in _error(r)
    if case == "other_class":
        assert "flux.1-schnell" in _error(r) and "CogVideoXPipeline" in _error(r)
    assert fake_model.loads == []


def test_a_matching_model_path_is_accepted(tmp_path):
    from sagegen.models.loading import check_model_path
    from sagegen.models.presets import resolve

    folder = _pipeline_folder(tmp_path / "m", "CogVideoXPipeline")
    assert check_model_path(resolve("cogvideox-5b"), folder) == folder


# ------------------------------------------------------------------------------------------ a full disk at start
class _FullDiskOs:
    """`os` for sagegen.runs.lock, whose writes fail as on a full disk (the lock file is the first write)."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def write(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_at_start_is_named_and_leaves_no_run_directory(fake_model, tmp_path, monkeypatch):
    from sagegen.runs import lock as runlock

    monkeypatch.setattr(runlock, "os", _FullDiskOs())
    out = tmp_path / "new" / "run"
    r = runner.invoke(app, ["run", "tiny-flux", "-p", "a", "-q", "--out", str(out)])
    assert r.exit_code == 1, r.output
    line = _error(r)
    assert ".sagegen-run.lock" in line and "no space left on device" in line and "--out" in line
    assert not (tmp_path / "new").exists()  # the folders this run created are gone again


# ------------------------------------------------------------------------------------------ eval weight files
@pytest.mark.parametrize("option", ["--clip-model", "--inception-weights", "--lpips-weights"])
def test_a_text_file_as_weights_is_a_usage_error(option, fake_model, tmp_path):
    run = tmp_path / "run"
    made = runner.invoke(app, ["compare", "tiny-flux", "-p", "a", "--steps", "1", "-q", "--out", str(run)])
    assert made.exit_code == 0, made.output
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    for value in (str(notes), f"ViT-B-32:{notes}") if option == "--clip-model" else (str(notes),):
        r = runner.invoke(app, ["eval", str(run), "--metric", "psnr", option, value])
        assert r.exit_code == 2, r.output
        assert option in _error(r) and "not a PyTorch or safetensors weights file" in _error(r)
    assert not (run / "metrics.json").exists()


def test_weight_files_are_recognised_by_their_first_bytes(tmp_path):
    import struct

    import torch

    from sagegen.eval.weights import BadOption, resolve_inception, weights_file_problem

    saved = tmp_path / "w.pt"
    torch.save({"a": torch.zeros(1)}, saved)
    header = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    safetensors = tmp_path / "w.safetensors"
    safetensors.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    assert weights_file_problem(saved) is None and weights_file_problem(safetensors) is None
    (tmp_path / "empty.pt").write_bytes(b"")
    assert "empty" in weights_file_problem(tmp_path / "empty.pt")
    (tmp_path / "t.pt").write_text("i am text")
    with pytest.raises(BadOption, match="--inception-weights: .* looks like text"):
        resolve_inception(str(tmp_path / "t.pt"))


# ------------------------------------------------------------------------------------------ sparse specs
@pytest.mark.parametrize("args,option", [
    (["run", "tiny-flux", "-p", "a", "--sparse", "topk=0.5,blocks="], "--sparse"),
    (["compare", "tiny-flux", "-p", "a", "--sparse", "cdf=0.9,blocks=0++1"], "--sparse"),
    (["calibrate", "tiny-flux", "-p", "a", "--sparse-options", "blocks="], "--sparse-options"),
    (["calibrate", "tiny-flux", "-p", "a", "--sparse-options", "first=maybe"], "--sparse-options"),
    (["run", "tiny-flux", "-p", "a", "--sparse", "radial,decay=1.5"], "--sparse"),
    (["run", "tiny-flux", "-p", "a", "--sparse", "topk=0.5,text=1"], "--sparse"),
])
def test_bad_sparse_specs_exit_2_naming_their_option(args, option, fake_model):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    line = _error(r)
    assert line.startswith(f"Error: {option} '")
    if option == "--sparse-options":
        assert "--sparse '" not in line
    assert fake_model.loads == []


def test_sparse_config_refuses_empty_block_names():
    from sagegen.sparse.sparse_config import SparseConfig

    with pytest.raises(ValueError, match="dense_blocks entries"):
        SparseConfig(dense_blocks=("",))
    with pytest.raises(ValueError, match="dense_blocks entries"):
        SparseConfig(dense_blocks=(True,))
    assert SparseConfig(dense_blocks=(0, "transformer_blocks.3")).dense_blocks == (0, "transformer_blocks.3")


@pytest.mark.parametrize("spec", ["topk=2", "bogus", "topk=0.5,blocks=", "calib=/nonexistent.json"])
def test_the_python_api_names_its_own_argument(spec):
    """`sagegen.patch(pipe, sparse="...")`: the error names sparse=, not the CLI's --sparse."""
    from sagegen.patch.sparse_policy import resolve_sparse
    from sagegen.sparse.text import SparseArgError

    with pytest.raises(SparseArgError) as info:
        resolve_sparse(spec)
    assert str(info.value).startswith(f"sparse={spec!r}: ") and "--" not in str(info.value)


# ------------------------------------------------------------------------------------------ bench
@pytest.mark.parametrize("extra,expected", [
    (["--only", "foo"], "--only: foo not among"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--sparse", "topk=2"], "--sparse 'topk=2'"),
    (["--compile-scope", "regional"], "needs --compile"),
])
def test_bench_option_mistakes_are_one_typer_style_line(extra, expected, tmp_path):
    r = runner.invoke(app, ["bench", "flux", *extra, "--out", str(tmp_path / "b.json")])
    assert r.exit_code == 2, r.output
    assert expected in _error(r) and "sagegen bench --help" in _error(r)


# ------------------------------------------------------------------------------------------ command line alone
# Mistakes the command line alone shows: answered without torch, diffusers or numpy (test_cli_startup's probe).
@pytest.mark.parametrize("args", [
    ["run", "tiny-cogvideox", "-p", "a", "--cp", "ulysses=2"],
    ["compare", "tiny-flux", "-p", "a", "--cp", "ring=2"],
    ["run", "tiny-flux", "-p", "a", "--linear", "fp8", "--attention", "sdpa"],
    ["run", "tiny-flux", "-p", "a", "--cuda-graphs", "--compile"],
    ["run", "tiny-mochi", "-p", "a", "--steps", "1"],
    ["run", "cogvideox", "-p", "a", "--model-path", "/nonexistent"],
    ["calibrate", "tiny-flux", "-p", "a", "--sparse-options", "blocks="],
    ["bench", "flux", "--only", "foo"],
    ["bench", "tiny-flux"],
    ["eval", "/nonexistent"],
    ["report", "/nonexistent"],
])
def test_command_line_mistakes_import_nothing_heavy(args, tmp_path):
    from tests.cli.test_cli_startup import _probe

    code, heavy, out = _probe(*args, tmp_path=tmp_path)
    assert code == 2, out
    heavy = set(heavy.split(",")) - {""} - ({"numpy"} if args[0] in ("eval", "report") else set())  # 0.1 s
    assert not heavy, f"`sagegen {' '.join(args)}` imported {heavy} before saying:\n{out}"


def test_shell_completion_offers_model_names(tmp_path):
    env = dict(os.environ, _SAGEGEN_COMPLETE="complete_bash", COMP_WORDS="sagegen run tiny-f", COMP_CWORD="2")
    r = subprocess.run([sys.executable, "-m", "sagegen"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.split() == ["tiny-flux"], r.stdout + r.stderr
    env.update(COMP_WORDS="sagegen bench flux.", COMP_CWORD="2")
    r = subprocess.run([sys.executable, "-m", "sagegen"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.split() == ["flux.1-dev", "flux.1-schnell"], r.stdout + r.stderr
    from sagegen.cli.completion import complete_model

    assert ("mochi", "alias of mochi-1") in complete_model("MOCH")
