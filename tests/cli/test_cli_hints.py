"""Issue 54, defect 7: every hint names options that exist on the command that prints it.

The `--cp` hint was `torchrun ... sagegen run ...` (not a command torchrun can start), and eval and report told
users of a full or read-only disk to use an `--out` they do not have. Here: the option names in the source of
each command's messages, the per-command hints of `sagegen.cli.errors`, and the printed errors of every command
(usage mistakes, a full disk, out of memory), each checked against the options of that command.
"""

from __future__ import annotations

import ast
import errno
import os
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sagegen.cli import errors
from sagegen.cli.app import app

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

ROOT = Path(__file__).resolve().parents[2]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
runner = CliRunner()

# options named in messages that belong to other programs, not to sagegen's commands
FOREIGN = {"--nproc-per-node", "--local-dir", "--install-completion", "--show-completion", "--help", "--debug"}


def options_of(command: str) -> set[str]:
    """Every option string the command takes (bench: also its benchmark options, passed through)."""
    group = typer.main.get_command(app)
    params = group.commands[command].params
    names = {o for p in params for o in (*p.opts, *getattr(p, "secondary_opts", ())) if o.startswith("--")}
    if command == "bench":
        from sagegen.cli import e2e_bench
        from sagegen.jobs.stepbench.args import parser

        names |= {o for a in parser()._actions for o in a.option_strings if o.startswith("--")}
        names |= {"--e2e"} | {o for a in e2e_bench.parser()._actions for o in a.option_strings if o.startswith("--")}
    return names | FOREIGN


# `sagegen compare MODEL --sparse calib=FILE` in calibrate's output names compare's option, not calibrate's
SUGGESTED = re.compile(r"sagegen (run|compare|eval|report|calibrate|bench|models|env)\b((?:(?!sagegen )[^`;\n])*)")


def named_options(text: str, command: str | None = None) -> set[str]:
    """The options a text names as its command's own; those inside a suggested `sagegen OTHER ...` command line
    are checked against OTHER here."""
    for other, tail in SUGGESTED.findall(text):
        unknown = sorted(set(OPTION.findall(tail)) - options_of(other))
        assert not unknown, f"a suggested `sagegen {other}{tail}` names {unknown}, which it does not have"
    return set(OPTION.findall(SUGGESTED.sub("", text)))


def strings_in(path: Path) -> str:
    """The texts of a module's messages and help (an f-string as one text, its fields as X), not the docstrings
    meant for developers (a command function's docstring is its --help, and is kept)."""
    tree = ast.parse(path.read_text())
    skip = {id(body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and (body := node.body)
            and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and not getattr(node, "name", "").endswith("_command")}
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in node.values}
            texts.append("".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values))
    texts += [n.value for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]
    return "\n".join(texts)


GENERATING = ("run", "compare")
# module -> the commands whose messages it writes (a message must name an option of each of them: for shared
# modules, of the union of the commands that reach the message's code path, checked below per group)
MODULES = {
    "sagegen/cli/eval_cmd.py": {"eval"},
    "sagegen/cli/report_cmd.py": {"report"},
    "sagegen/cli/calibrate_cmd.py": {"calibrate"},
    "sagegen/cli/bench_cmd.py": {"bench"},
    "sagegen/jobs/stepbench/args.py": {"bench"},
    "sagegen/cli/run_cmd.py": {"run"},
    "sagegen/cli/compare_cmd.py": {"compare"},
    # written by eval alone, or by report alone
    "sagegen/eval/weights.py": {"eval"},
    "sagegen/eval/runner.py": {"eval"},
    "sagegen/eval/clip.py": {"eval"},
    "sagegen/eval/fid.py": {"eval"},
    # read and written by every command that touches a run directory: no option at all may be named there
    "sagegen/runs/files.py": set(),
    "sagegen/runs/directory.py": set(),
    "sagegen/runs/integrity.py": set(),
    "sagegen/runs/encode.py": set(),
    "sagegen/runs/reader.py": set(),
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_messages_name_options_of_their_command(module):
    path = ROOT / module
    if not path.exists():
        pytest.skip(f"{module} is not in this checkout")
    named = named_options(strings_in(path)) - FOREIGN
    commands = MODULES[module]
    allowed = set.intersection(*(options_of(c) for c in commands)) if commands else set()
    unknown = sorted(named - allowed)
    assert not unknown, f"{module} names {unknown}, which {sorted(commands) or 'not every command'} lack"


def test_generation_modules_name_options_of_run_or_compare():
    allowed = options_of("run") | options_of("compare")
    for module in ("sagegen/cli/jobs.py", "sagegen/cli/checks.py", "sagegen/cli/options.py",
                   "sagegen/cli/cp_option.py", "sagegen/cli/sparse_opt.py", "sagegen/models/loading.py",
                   "sagegen/models/presets.py", "sagegen/jobs/generate.py", "sagegen/runs/manifest.py",
                   "sagegen/runs/lock.py"):
        unknown = sorted(named_options(strings_in(ROOT / module)) - allowed)
        assert not unknown, f"{module} names {unknown}, options neither run nor compare has"


@pytest.mark.parametrize("table", ["WRITE_ELSEWHERE", "MEMORY_SAVERS"])
def test_per_command_hints_name_their_own_options(table):
    hints = getattr(errors, table)
    for command in typer.main.get_command(app).commands:
        if command in ("models", "env"):
            continue
        assert command in hints, f"{table} has no hint for `sagegen {command}`"
    for command, text in hints.items():
        unknown = sorted(named_options(text) - options_of(command))
        assert not unknown, f"{table}[{command!r}] names {unknown}, which `sagegen {command}` does not have"


def _printed_options_exist(result, command: str) -> None:
    unknown = sorted(named_options(result.output) - options_of(command))
    assert not unknown, f"`sagegen {command}` printed {unknown}, options it does not have:\n{result.output}"


USAGE = [
    ["calibrate", "tiny-flux", "-p", "a", "--sparse-options", "blocks="],
    ["calibrate", "tiny-flux", "-p", "a", "--sparse-options", "bogus=1"],
    ["calibrate", "tiny-mochi", "-p", "a", "--steps", "1"],
    ["calibrate", "cogvideox", "-p", "a", "--model-path", "/nonexistent"],
    ["calibrate", "tiny-flux", "-p", "a", "--kernel", "nope=1"],
    ["run", "tiny-flux", "-p", "a", "--sparse", "topk=0.5,blocks="],
    ["compare", "tiny-flux", "-p", "a", "--cp", "ring=2"],
    ["run", "tiny-flux", "-p", "a", "--linear", "fp8", "--attention", "sdpa"],
    ["bench", "flux", "--only", "foo"],
    ["bench", "flux", "--sparse", "topk=2"],
    ["eval", "/nonexistent"],
    ["report", "/nonexistent"],
]


@pytest.mark.parametrize("args", USAGE, ids=[" ".join(a) for a in USAGE])
def test_usage_errors_name_options_of_their_command(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    _printed_options_exist(r, args[0])


def _no_space(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def compared(fake_model, tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["compare", "tiny-flux", "-p", "a fox", "--steps", "1", "-q", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("command", ["eval", "report"])
def test_a_full_disk_under_eval_and_report_names_no_missing_option(command, compared, monkeypatch):
    """Their files go into the run directory: the hint says to copy it, not to use an --out they lack."""
    from sagegen.runs import files as runfiles

    monkeypatch.setattr(runfiles, "_umask_mode", _no_space)  # every atomic write fails as on a full disk
    args = [command, str(compared)] + (["--metric", "psnr"] if command == "eval" else ["--no-mp4"])
    r = runner.invoke(app, args)
    assert r.exit_code == 1, r.output
    line = [ln for ln in r.output.splitlines() if ln.startswith("Error:")][0]
    assert "no space left on device" in line and "copy the run directory" in " ".join(r.output.split())
    assert "--out" not in r.output
    _printed_options_exist(r, command)


def test_out_of_memory_hints_name_only_the_commands_options(compared, monkeypatch):
    """eval has no --offload or --vae-tiling; its hint must not offer them."""
    from sagegen.eval import runner as eval_runner

    class OutOfMemoryError(RuntimeError):
        pass

    def oom(*a, **k):
        raise OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(eval_runner, "evaluate", oom)
    r = runner.invoke(app, ["eval", str(compared), "--metric", "psnr"])
    assert r.exit_code == 1 and "out of memory" in r.output, r.output
    assert "--offload" not in r.output
    _printed_options_exist(r, "eval")
