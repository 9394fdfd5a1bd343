"""Every `sagegen ...` command in the README's and docs/' code blocks still parses: its command, options and
option values are what the CLI accepts (nothing runs). Lines with placeholders (MODEL, RUN_DIR, ...) are left out.
A renamed option or a dropped command then fails here instead of in a new user's terminal."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from sagegen.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\.\.\.(?!\")|<[a-z]")  # MODEL, RUN_DIR, "..." is a prompt; <id>


def _documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of each `sagegen` invocation in a fenced code block (``&&`` chains split, comments cut)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                continue
            for part in re.split(r"&&|;", re.split(r"\s{2,}(?=[^-\s])", line.strip())[0]):  # a column of notes
                part = part.strip().removeprefix("$ ")
                if not part.startswith("sagegen ") or PLACEHOLDER.search(part.split("#")[0]):
                    continue
                try:
                    argv = shlex.split(part, comments=True)[1:]
                except ValueError:  # a quote that the line does not close: not a command
                    continue
                found.append((f"{path.relative_to(ROOT)}:{number}", argv))
    return found


COMMANDS = _documented_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 15 and {argv[0] for _, argv in COMMANDS} >= {"run", "compare", "eval", "report", "bench"}


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_parses(where, argv):
    group = typer.main.get_command(app)
    ctx = click.Context(group, info_name="sagegen")
    name, *rest = argv
    if name.startswith("-"):  # an option of `sagegen` itself (--version)
        assert any(name in p.opts for p in group.get_params(ctx)), f"{where}: sagegen has no option {name}"
        return
    command = group.get_command(ctx, name)
    assert command is not None, f"{where}: no command {name!r}"
    try:
        sub = command.make_context(name, rest, parent=ctx)
    except click.UsageError as e:
        pytest.fail(f"{where}: sagegen {shlex.join(argv)}: {e.format_message()}")
    values = sub.params
    if name in ("run", "compare", "calibrate"):  # the values the commands check themselves, before loading
        from sagegen.cli import sparse_opt
        from sagegen.cli.options import load_prompts
        from sagegen.models.presets import resolve

        resolve(values["model"])  # UnknownModel names it
        if "calib=" not in (values.get("sparse") or ""):  # (calib= names the user's calibration file)
            sparse_opt.parse(values.get("sparse"))
        if values.get("prompts") and not values["prompts"].endswith(".txt"):  # a built-in set (not a user's file)
            assert load_prompts([], values["prompts"], None), where
    if name == "bench":  # the model as `bench` resolves it, and the options through the benchmark's own parser
        from sagegen import stepbench
        from sagegen.cli.bench_cmd import bench_architecture

        out = [] if "--out" in sub.args else ["--out", "x.json"]  # (the command adds one under runs/)
        try:
            stepbench.parse_args([bench_architecture(values["model"]), *sub.args, *out])
        except SystemExit as e:
            pytest.fail(f"{where}: sagegen {shlex.join(argv)}: the benchmark's parser refused it ({e.code})")
