"""``--cp cfg=C,ulysses=U,ring=R``: one video over several GPUs: diffusers' context parallelism (Ulysses U, Ring
R) splits the sequence, and CFG parallelism (``cfg=2``, `sagegen.patch.cp.cfg`) puts the two guidance branches
on different processes (Ulysses / Ring inside each branch).

Launched as ``torchrun --nproc-per-node C*U*R -m sagegen run MODEL ... --cp cfg=C,ulysses=U,ring=R`` (``-m``:
torchrun starts Python scripts and modules, not console commands). Every process runs every sample (the work of
each sample is split, not the prompts) and rank 0 writes it; without ``--cp`` the processes share the prompts
instead (prompt sharding). Everything here is checked before any weights load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from sagegen.cli.errors import UsageProblem

OPTION = "--cp"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

Cp = Annotated[Optional[str], typer.Option(
    OPTION, metavar="cfg=C,ulysses=U,ring=R", rich_help_panel="Memory and speed", show_default=False,
    help="Split each sample over C*U*R processes: the guidance branches (cfg=2), the sequence (Ulysses U, Ring "
         "R); launch with torchrun --nproc-per-node C*U*R -m sagegen ...")]


@dataclass(frozen=True)
class CpSpec:
    ulysses: int = 1
    ring: int = 1
    cfg: int = 1

    @property
    def world(self) -> int:
        return self.cfg * self.ulysses * self.ring

    @property
    def sequence_split(self) -> bool:
        return self.ulysses * self.ring > 1

    def to_dict(self) -> dict:
        # cfg only where used: runs without it keep their run-directory hash
        return {"ulysses": self.ulysses, "ring": self.ring, **({"cfg": self.cfg} if self.cfg > 1 else {})}

    def text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.to_dict().items())


def parse_cp(text: str) -> CpSpec:
    """``ulysses=2,ring=2`` / ``ulysses=4`` / ``ring=2`` / ``cfg=2,ulysses=2`` -> CpSpec (UsageProblem
    otherwise)."""
    degrees = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("cfg", "ulysses", "ring") or key in degrees:
            raise UsageProblem(f"{text!r}: write cfg=C,ulysses=U,ring=R (each at most once), e.g. ulysses=2,ring=2 "
                               "or cfg=2,ulysses=2", OPTION)
        try:
            degrees[key] = int(value)
        except ValueError:
            raise UsageProblem(f"{key}={value!r} is not an integer", OPTION) from None
        if degrees[key] < 1:
            raise UsageProblem(f"{key}={degrees[key]}: degrees are at least 1", OPTION)
    spec = CpSpec(**degrees)
    if spec.cfg > 2:
        raise UsageProblem(f"cfg={spec.cfg}: classifier-free guidance has two branches; use cfg=2", OPTION)
    if spec.world < 2:
        raise UsageProblem(f"{text!r} uses one process; give cfg, ulysses and/or ring degrees whose product is "
                           ">= 2", OPTION)
    return spec


def launch_command(spec: CpSpec) -> str:
    """The command line that runs this one under torchrun: ``-m sagegen`` (torchrun runs Python scripts and
    modules; a bare ``sagegen`` is taken for a script file and fails)."""
    import shlex

    from sagegen.cli.options import command_line

    args = command_line()[1:]
    if not args or args[0] not in ("run", "compare"):  # not called from the CLI (a test, the API)
        args = ["run", "MODEL", "...", OPTION, spec.text()]
    return f"torchrun --nproc-per-node {spec.world} -m sagegen {shlex.join(args)}"


def check_launch(spec: CpSpec, environ=os.environ) -> None:
    """torchrun's variables are set and WORLD_SIZE is ulysses * ring."""
    missing = [v for v in TORCHRUN_VARS if not environ.get(v)]
    if missing:
        raise UsageProblem(f"needs torchrun (missing {', '.join(missing)}): launch as {launch_command(spec)}",
                           OPTION)
    world = int(environ["WORLD_SIZE"])
    if world != spec.world:
        raise UsageProblem(f"{' x '.join(spec.text().split(','))} = {spec.world} processes, but torchrun "
                           f"started {world} (WORLD_SIZE); use --nproc-per-node {spec.world} (times nodes)",
                           OPTION)


def preset_transformer(preset) -> tuple[str | None, int | None]:
    """The denoiser's diffusers class name and head count of a preset, from sagegen's configs (no weights); the
    class from the pipeline's ``transformer`` annotation and no head count where sagegen has no config."""
    if preset.tiny:
        from sagegen.models import tiny

        try:
            return tiny._TRANSFORMER_CLASSES[preset.family], tiny.tiny_transformer_config(preset.family)[
                "num_attention_heads"]
        except (AttributeError, KeyError, ValueError):
            pass
        from sagegen.models import tiny_classes    # the newer classes' tiny denoisers (HunyuanVideo-1.5, LTX, ...)

        if preset.family in tiny_classes.TINY_CLASSES:
            return (tiny_classes._CLASS_NAMES[preset.family],
                    tiny_classes.tiny_class_config(preset.family)["num_attention_heads"])
    else:
        from sagegen.models.arch import ARCHS

        arch = ARCHS.get(preset.name)
        if arch is not None:
            return arch.cls, arch.config.get("num_attention_heads")
    return _pipeline_transformer(preset.pipeline), None


def _pipeline_transformer(pipeline: str) -> str | None:
    import inspect

    import diffusers

    try:
        ann = inspect.signature(getattr(diffusers, pipeline).__init__).parameters["transformer"].annotation
    except (AttributeError, KeyError, ValueError, TypeError):
        return None
    name = ann if isinstance(ann, str) else getattr(ann, "__name__", None)
    return name if name and hasattr(diffusers, name) else None


def check_model(spec: CpSpec, preset) -> None:
    """The model can run context-parallel and its heads split over the Ulysses degree."""
    import diffusers

    from sagegen.patch.cp.enable import check_heads
    from sagegen.patch.cp.plans import ContextParallelUnsupported, check_cp_config, check_cp_support

    try:
        check_cp_config(spec.ulysses, spec.ring)
    except ContextParallelUnsupported as e:
        raise UsageProblem(str(e), OPTION) from None
    cls_name, heads = preset_transformer(preset)
    if cls_name is None:
        return  # checked again when the model is built (enable_context_parallel)
    try:
        check_cp_support(getattr(diffusers, cls_name))
        check_heads(heads, spec.ulysses)
    except (ContextParallelUnsupported, ValueError) as e:
        raise UsageProblem(f"{preset.name}: {e}", OPTION) from None


def check_cp(text: str | None, preset, *, offload: str = "none", environ=os.environ,
             guidance: float | None = None) -> CpSpec | None:
    """Everything about --cp that can be checked before loading (UsageProblem, exit 2). None without --cp."""
    if text is None:
        return None
    spec = parse_cp(text)
    if offload != "none":
        raise UsageProblem("CPU offload cannot be combined with context parallelism; drop --offload", OPTION)
    check_launch(spec, environ)  # first: it needs no torch (check_model imports diffusers, seconds)
    if spec.cfg > 1:
        check_guidance_split(spec, preset, guidance)
    if spec.sequence_split:
        check_model(spec, preset)
    return spec


def check_guidance_split(spec: CpSpec, preset, guidance: float | None) -> None:
    """cfg=2: the preset's pipeline runs classifier-free guidance that can be split, at this guidance."""
    from sagegen.patch.cp.cfg import CfgParallelError, check_cfg

    try:
        check_cfg(preset.pipeline, cfg=spec.cfg, world=spec.world,
                  guidance=preset.guidance if guidance is None else guidance)
    except CfgParallelError as e:
        raise UsageProblem(f"{preset.name}: {e}", OPTION) from None
