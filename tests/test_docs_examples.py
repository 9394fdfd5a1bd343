"""The examples in the README's and docs/' code blocks still match the code (nothing runs):
- every `sagegen ...` command parses: its command, options and option values are what the CLI accepts (lines
  with placeholders such as MODEL or RUN_DIR are left out);
- every Python block parses, every name it takes from sagegen exists after a plain `import sagegen` (in a fresh
  interpreter, as a user's script starts), and every keyword it passes to a sagegen callable is a parameter.
A renamed option, function or keyword then fails here instead of in a new user's terminal."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
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
        from sagegen.jobs.stepbench import bench as stepbench
        from sagegen.cli.bench_cmd import bench_architecture

        out = [] if "--out" in sub.args else ["--out", "x.json"]  # (the command adds one under runs/)
        try:
            stepbench.parse_args([bench_architecture(values["model"]), *sub.args, *out])
        except SystemExit as e:
            pytest.fail(f"{where}: sagegen {shlex.join(argv)}: the benchmark's parser refused it ({e.code})")


def _python_blocks() -> list[tuple[str, str]]:
    blocks = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines, start = path.read_text().splitlines(), None
        for number, line in enumerate(lines, 1):
            if line.strip() == "```python":
                start = number
            elif line.strip() == "```" and start is not None:
                blocks.append((f"{path.relative_to(ROOT)}:{start}", "\n".join(lines[start:number - 1])))
                start = None
    return blocks


def _sagegen_uses(source: str) -> list[tuple[str, list[str]]]:
    """(dotted name, keywords) of each use of a sagegen name: `sagegen.a.b` attributes, names imported from
    sagegen, and calls of either (with their keyword names)."""
    tree = ast.parse(source)
    imported = {}  # local name -> dotted sagegen name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sagegen":
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(node):
        if isinstance(node, ast.Name):
            return "sagegen" if node.id == "sagegen" else imported.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    uses = [(name, []) for name in imported.values()]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and dotted(node.func):
            uses.append((dotted(node.func), [k.arg for k in node.keywords if k.arg]))
        elif isinstance(node, ast.Attribute) and dotted(node):
            uses.append((dotted(node), []))
    return uses


_CHECK = """
import importlib, inspect, json, sys
import sagegen
problems = []
for name, keywords in json.loads(sys.argv[1]):
    parts = name.split(".")
    obj, path = sagegen, "sagegen"
    for i, part in enumerate(parts[1:], 1):
        path = ".".join(parts[:i + 1])
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:  # `from sagegen.x.y import z`: the module is imported by the statement itself
                obj = importlib.import_module(path)
            except ImportError:
                problems.append(f"{name}: no {path}")
                break
    else:
        if keywords:
            try:
                params = inspect.signature(obj).parameters.values()
            except (TypeError, ValueError):
                continue
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                names = {p.name for p in params}
                problems += [f"{name}: no keyword {k!r}" for k in keywords if k not in names]
print(json.dumps(problems))
"""


def test_python_examples_match_the_api():
    uses, broken = [], []
    for where, source in _python_blocks():
        try:
            uses += [(name, keywords) for name, keywords in _sagegen_uses(source)]
        except SyntaxError as e:
            broken.append(f"{where}: {e}")
    assert not broken, broken
    assert len(uses) >= 20 and any(name == "sagegen.patch" for name, _ in uses)
    done = subprocess.run([sys.executable, "-c", _CHECK, json.dumps(uses)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_files_the_docs_name_exist():
    """Scripts, modules and pages the README and docs/ point to (bench/..., sagegen/..., tests/..., docs/...)."""
    pattern = re.compile(r"(?<![\w/.-])((?:bench|sagegen|tests|docs|prompts)/[\w./-]+\.(?:py|sh|md|txt))\b")
    missing, seen = [], 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name in pattern.findall(line):
                seen += 1
                if not (ROOT / name).exists() and not (path.parent / name).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert seen >= 30 and not missing, missing
