"""The command line starts fast: help, --version and usage errors import neither torch nor the patcher."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "diffusers", "transformers", "triton", "numpy", "sagegen.patch", "sagegen.api")

# Runs the CLI in-process, then prints which heavy modules it imported (on stdout's last line).
_PROBE = """
import sys
from sagegen.cli.app import main
sys.argv = ["sagegen", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "diffusers", "transformers", "triton", "numpy"}
               or m in ("sagegen.patch", "sagegen.api"))
print("EXIT", code, "HEAVY", ",".join(m for m in heavy if m.count(".") == 0 or m.startswith("sagegen")))
"""


def _probe(*args: str, tmp_path: Path) -> tuple[int, str, str]:
    env = dict(os.environ, SAGEGEN_RUNS=str(tmp_path / "runs"), HF_HUB_OFFLINE="1", COLUMNS="120")
    env.pop("SAGEGEN_DEBUG", None)
    r = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("EXIT"), r.stdout + r.stderr
    _, code, _, heavy = (last.split(" ", 3) + [""])[:4]
    return int(code), heavy.strip(), r.stdout + r.stderr


@pytest.mark.parametrize("args", [
    ["--help"],
    ["--version"],
    ["run", "--help"],
    ["compare", "--help"],
    ["eval", "--help"],
    ["report", "--help"],
    ["bench", "--help"],
    ["run"],                                   # missing MODEL
    ["run", "tiny-flux", "--bogus"],           # unknown option
    ["run", "cogvidx", "--prompt", "a"],       # unknown model (found after parsing)
    ["run", "tiny-flux"],                      # no prompt
    ["run", "tiny-flux", "-p", "a", "--seed", "x"],
])
def test_no_heavy_imports(args, tmp_path):
    code, heavy, out = _probe(*args, tmp_path=tmp_path)
    assert heavy == "", f"`sagegen {' '.join(args)}` imported {heavy}\n{out}"
    assert code in (0, 2), out


def test_version(tmp_path):
    code, _, out = _probe("--version", tmp_path=tmp_path)
    import sagegen

    assert code == 0 and f"sagegen {sagegen.__version__}" in out


def test_help_shows_no_type_metavars(tmp_path):
    for cmd in ("run", "compare", "eval", "report", "models", "env"):
        code, _, out = _probe(cmd, "--help", tmp_path=tmp_path)
        assert code == 0, out
        for bad in ("<bool>", "range>", "<list[", "<str>", "<int>", "[x>="):
            assert bad not in out, f"`sagegen {cmd} --help` shows {bad}:\n{out}"
        if cmd != "compare":
            assert "Example" in out, f"`sagegen {cmd} --help` has no example"
    code, _, out = _probe("run", "--help", tmp_path=tmp_path)
    assert "--no-vae-tiling" in out and "--no-random-weights" in out
    code, _, out = _probe("eval", "--help", tmp_path=tmp_path)
    text = " ".join(out.replace("│", " ").split())  # rich wraps the help column
    assert "Default: all available" in text and "every metric that applies" in text


def test_completion_is_offered(tmp_path):
    code, _, out = _probe("--help", tmp_path=tmp_path)
    assert "--install-completion" in out and "--show-completion" in out


def test_help_is_fast(tmp_path):
    """`sagegen --help` in a fresh interpreter: the target is 1.5 s on an idle dev machine. Measured against
    `python -c pass` so that a loaded machine does not fail it; torch alone takes longer than the bound."""
    env = dict(os.environ, COLUMNS="120")

    def wall(cmd):
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=120)
            best = min(best, time.perf_counter() - t0)
        return best

    base = wall([sys.executable, "-c", "pass"])
    help_s = wall([sys.executable, "-m", "sagegen", "--help"])
    torch_s = wall([sys.executable, "-c", "import torch"])
    assert help_s - base < 0.6 * (torch_s - base), (help_s, torch_s, base)


def test_patch_stays_callable_when_the_package_was_imported_first():
    """`sagegen.patch(pipe)` works whichever of `sagegen.patch.<module>` / `sagegen.patch` came first."""
    code = ("import sagegen, sagegen.patch.precision_policy; "
            "assert callable(sagegen.patch); "
            "from sagegen.patch import patch; assert sagegen.patch.__call__ is not None; "
            "print(sagegen.PrecisionPolicy.__name__, sagegen.sageattn.__name__)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "PrecisionPolicy sageattn" in r.stdout, r.stderr
