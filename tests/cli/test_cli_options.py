"""Option parsing shared by `sagegen run` / `compare`, and the model presets."""

import pytest

from sagegen.cli.errors import UsageProblem
from sagegen.cli.options import (builtin_prompt_sets, kernel_config, load_prompts, parse_seeds,
                                 precision_policy)
from sagegen.config import DIFFUSION_CONFIG
from sagegen.models.presets import PRESETS, UnknownModel, check_shape, resolve


@pytest.mark.parametrize("values, expected", [
    ([], [0]),
    (["7"], [7]),
    (["0,1,2"], [0, 1, 2]),
    (["0-3"], [0, 1, 2, 3]),
    (["5", "1-2", "5"], [5, 1, 2]),  # repeated, de-duplicated in order
    ([" 3 , 4 "], [3, 4]),
])
def test_parse_seeds(values, expected):
    assert parse_seeds(values) == expected


@pytest.mark.parametrize("bad", ["x", "3-1", "1.5", "-2", "0-x"])
def test_parse_seeds_rejects_with_option_name(bad):
    with pytest.raises(UsageProblem) as e:
        parse_seeds([bad])
    assert str(e.value).startswith("--seed:")
    assert "0-3" in str(e.value)


def test_prompt_file_comments_and_blank_lines(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("# header\n\nfirst prompt\n  # indented comment\nsecond prompt  \n", encoding="utf-8")
    assert load_prompts([], str(f), None) == ["first prompt", "second prompt"]
    assert load_prompts(["extra"], str(f), 2) == ["extra", "first prompt"]


def test_builtin_prompt_sets_exist_and_are_sized():
    sets = builtin_prompt_sets()
    assert {"smoke", "t2v", "t2i"} <= set(sets)
    smoke = load_prompts([], "smoke", None)
    assert 2 <= len(smoke) <= 3
    assert len(load_prompts([], "t2v", None)) >= 24
    assert len(load_prompts([], "t2i", None)) >= 12
    assert all(not p.startswith("#") for p in load_prompts([], "t2v", None))


def test_builtin_prompt_sets_from_an_installed_wheel(monkeypatch, tmp_path):
    """Outside a source tree (a wheel install) the sets come from <prefix>/share/sagegen/prompts, which the
    wheel's data files fill (see test_wheel_ships_the_prompt_sets)."""
    from sagegen.cli import options

    monkeypatch.delenv(options.PROMPTS_ENV, raising=False)
    monkeypatch.setattr(options, "__file__", str(tmp_path / "site" / "sagegen" / "cli" / "options.py"))
    prefix = tmp_path / "prefix"
    (prefix / "share" / "sagegen" / "prompts").mkdir(parents=True)
    (prefix / "share" / "sagegen" / "prompts" / "smoke.txt").write_text("a fox\n", encoding="utf-8")
    monkeypatch.setattr(options.sysconfig, "get_path", lambda name: str(prefix) if name == "data" else None)
    assert load_prompts([], "smoke", None) == ["a fox"]


@pytest.mark.slow
def test_wheel_ships_the_prompt_sets(tmp_path):
    """The wheel built from this tree carries prompts/*.txt as data files under share/sagegen/prompts."""
    import pathlib
    import shutil
    import subprocess
    import sys
    import zipfile

    root = pathlib.Path(__file__).resolve().parents[2]
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the source tree
    shutil.copytree(root / "sagegen", src / "sagegen", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "prompts", src / "prompts")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("sagegen-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.rsplit("/", 1)[1] for n in names if "/data/share/sagegen/prompts/" in n}
    assert shipped == {p.name for p in (root / "prompts").glob("*.txt")} and "smoke.txt" in shipped


@pytest.mark.parametrize("prompt, prompts, match", [
    ([], None, "--prompt"),
    ([""], None, "empty prompt"),
    ([], "no-such-set-or-file", "built-in"),
])
def test_prompt_errors(prompt, prompts, match):
    with pytest.raises(UsageProblem, match=match):
        load_prompts(prompt, prompts, None)


def test_empty_prompt_file(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("# only a comment\n")
    with pytest.raises(UsageProblem, match="holds no prompts"):
        load_prompts([], str(f), None)


def test_kernel_config_overrides():
    assert kernel_config([]) == DIFFUSION_CONFIG
    c = kernel_config(["pv_precision=fp16", "smooth-q=true", "block_k=none", "k_granularity=per_token"])
    assert (c.pv_precision, c.smooth_q, c.block_k, c.k_granularity, c.smooth_v) == \
        ("fp16", True, None, "per_token", True)


@pytest.mark.parametrize("item, match", [
    ("nope=1", "KEY one of"),
    ("pv_precision", "KEY=VALUE"),
    ("pv_precision=fp4", "fp8"),
    ("smooth_k=maybe", "true or false"),
    ("block_q=100", "16, 32"),
])
def test_kernel_config_errors_name_option_and_choices(item, match):
    with pytest.raises(UsageProblem, match=match) as e:
        kernel_config([item])
    assert str(e.value).startswith("--kernel:")


def test_precision_policy():
    assert precision_policy(None, 0, 0) is None
    p = precision_policy("0, -1, single_transformer_blocks.*", 2, 1)
    assert p.blocks == (0, -1, "single_transformer_blocks.*")
    assert (p.first_steps, p.last_steps) == (2, 1)


def test_resolve_aliases_hub_ids_and_suggestions():
    assert resolve("cogvideox").name == "cogvideox-2b"
    assert resolve("FLUX.1-dev").name == resolve("flux1-dev").name == "flux.1-dev"
    assert resolve("THUDM/CogVideoX-5b").name == "cogvideox-5b"
    assert resolve("zai-org/CogVideoX1.5-5B").name == "cogvideox1.5-5b"
    assert resolve("tiny").name == "tiny-cogvideox"
    with pytest.raises(UnknownModel, match="did you mean 'cogvideox-2b'"):
        resolve("cogvidex-2b")


def test_presets_cover_issue_models_with_sources():
    full = [p for p in PRESETS.values() if not p.tiny]
    assert {p.name for p in full} == {"cogvideox-2b", "cogvideox-5b", "cogvideox1.5-5b", "hunyuanvideo", "mochi-1",
                                      "flux.1-schnell", "flux.1-dev", "sd3.5-large", "sd3.5-large-turbo",
                                      "sd3.5-medium", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-t2v-a14b",
                                      "wan2.2-ti2v-5b", "ltx-video", "qwen-image", "hunyuanvideo-1.5"}
    for p in full:
        assert p.hub_id and "/" in p.hub_id and p.source, p.name
        errors, _ = check_shape(p, height=p.height, width=p.width, frames=p.frames)
        assert errors == [], p.name
        assert (p.fps is not None) == p.is_video
    # CogVideoX1.5's pipeline default resolution is unusable: the preset must carry its own
    assert (resolve("cogvideox1.5").width, resolve("cogvideox1.5").height) == (1360, 768)
    tiny = {p.family for p in PRESETS.values() if p.tiny}
    assert tiny == {"cogvideox", "hunyuanvideo", "mochi", "flux", "sd3", "wan", "ltx", "qwenimage", "hunyuanvideo15"}


def test_check_shape_errors_and_frame_warnings():
    p = resolve("cogvideox-2b")
    errors, warnings = check_shape(p, height=470, width=720, frames=49)
    assert errors and "--height 470" in errors[0] and "464 or 480" in errors[0]
    errors, warnings = check_shape(p, height=480, width=720, frames=50)
    assert errors == [] and "4k+1" in warnings[0] and "49 or 53" in warnings[0]


def test_every_command_option_names_itself():
    """Every option declares its flags (`typer.Option("--device", ...)`): typer 0.27 named an option without
    them after its metavar (`--DEVICE`), so `sagegen run ... --device cuda` failed there as "No such option"."""
    import inspect

    import typer.models

    from sagegen.cli.app import app

    checked = 0
    for command in app.registered_commands:
        for name, param in inspect.signature(command.callback, eval_str=True).parameters.items():
            infos = [m for m in getattr(param.annotation, "__metadata__", ())
                     if isinstance(m, typer.models.ParameterInfo)]
            infos += [param.default] if isinstance(param.default, typer.models.ParameterInfo) else []
            for info in infos:
                if isinstance(info, typer.models.OptionInfo):
                    # in Annotated[...] the first flag lands in `default`; typer reads it as a flag from there
                    first = [info.default] if isinstance(info.default, str) and info.default.startswith("-") else []
                    flags = [d for decl in (*first, *info.param_decls) for d in decl.split("/")]
                    assert any(f.startswith("--") for f in flags), (command.callback.__name__, name, flags)
                    checked += 1
    assert checked > 60, checked
