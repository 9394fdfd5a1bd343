"""Issue 22, bug 5: `sagegen bench` without a GPU says so; aliases as for `run`; usage errors exit 2."""

import pytest
import torch
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.cli.bench_cmd import bench_architecture

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

runner = CliRunner()


def _error(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("debug", [[], ["--debug"]])
def test_no_gpu_gives_the_real_reason(debug):
    r = runner.invoke(app, ["bench", "cogvideox-5b", "--compile", *debug])  # the help's own example
    line = _error(r)
    assert r.exit_code == 2 and "no CUDA GPU" in line and "--tiny" in line and "bad benchmark option" not in r.output


@pytest.mark.parametrize("name,arch", [("cogvideox", "cogvideox-2b"), ("CogVideoX-5b", "cogvideox-5b"),
                                       ("flux", "flux.1-schnell"), ("mochi", "mochi-1"), ("hunyuan", "hunyuanvideo"),
                                       ("THUDM/CogVideoX-5b", "cogvideox-5b"), ("sd3.5", "sd3.5-large")])
def test_run_aliases_are_accepted(name, arch):
    assert bench_architecture(name) == arch


def test_every_full_size_preset_has_an_architecture():
    """`sagegen models` lists them; `sagegen bench NAME` must take each (hunyuanvideo-1.5 was refused)."""
    from sagegen.models import arch
    from sagegen.models.presets import PRESETS

    full = [p for p in PRESETS.values() if not p.name.startswith("tiny-")]
    assert len(full) >= 17
    for preset in full:
        assert arch.get_arch(bench_architecture(preset.name)).family == preset.family, preset.name
    assert bench_architecture("hunyuanvideo-1.5") == "hunyuanvideo-1.5-720p"


def test_unknown_and_tiny_models_are_usage_errors():
    r = runner.invoke(app, ["bench", "cogvidx"])
    assert r.exit_code == 2 and "did you mean" in _error(r)
    r = runner.invoke(app, ["bench", "tiny-flux"])
    assert r.exit_code == 2 and "flux.1-dev" in _error(r) and "--tiny" in _error(r)
    # with --tiny, a tiny preset stands for its family's architecture, shrunk
    assert bench_architecture("tiny-flux", tiny=True) == "flux.1-dev"
    from sagegen.models import arch

    assert arch.get_arch(bench_architecture("tiny-wan2.1", tiny=True)).family == "wan"


def test_bad_benchmark_option_exits_2_with_argparse_message(tmp_path):
    r = runner.invoke(app, ["bench", "cogvideox", "--tiny", "--repeats", "zero", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "--repeats" in r.output


def test_a_bad_option_is_named_before_the_gpu_check(tmp_path):
    """Without --tiny on a CPU machine, a wrong option still gets its own message (not "no CUDA GPU")."""
    r = runner.invoke(app, ["bench", "flux.1-dev", "--linear", "fp16", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "invalid choice: 'fp16'" in r.output and "no CUDA GPU" not in r.output


def test_tiny_smoke_through_the_cli(tmp_path):
    out = tmp_path / "b.json"
    r = runner.invoke(app, ["bench", "flux", "--tiny", "--warmup", "0", "--repeats", "1", "--no-zero-attention",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file() and "not a speed measurement" in r.output


def test_the_help_names_every_benchmark_option():
    """`sagegen bench --help` lists the options it passes on (typer cannot see them): every option of the
    benchmark's own parser, so that a new one cannot go unmentioned (--cuda-graphs once did)."""
    import re

    from sagegen.jobs.stepbench import bench as stepbench
    from sagegen.cli.bench_cmd import bench_command

    import contextlib
    import io

    out = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(out):
        stepbench.parse_args(["--help"])
    options = set(re.findall(r"(--[a-z][a-z0-9-]+)", out.getvalue())) - {"--help"}
    assert {"--cuda-graphs", "--sparse", "--linear"} <= options
    missing = sorted(o for o in options if o not in re.findall(r"--[a-z][a-z0-9-]+", bench_command.__doc__))
    assert not missing, f"not in `sagegen bench --help`: {missing}"
