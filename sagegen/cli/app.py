"""The ``sagegen`` command line: a thin typer app; each command lives in its own module.

Adding a command: write ``sagegen/cli/<name>_cmd.py`` with ``register(app: typer.Typer)`` that calls
``app.command("<name>")(fn)``, and list the module in `COMMAND_MODULES`. Modules that are not there yet
are skipped; one that fails to import gets a stand-in command that reports the failure (exit 1). Decorate
command functions with `sagegen.cli.errors.cli_command` for one-line errors (usage: exit 2, runtime: exit 1,
tracebacks only with ``--debug`` or ``SAGEGEN_DEBUG=1``).
"""

from __future__ import annotations

import importlib
import sys

import typer
from typer.core import TyperGroup

from sagegen.cli import errors, helpfmt

# In the order `sagegen --help` lists them.
COMMAND_MODULES = ("run_cmd", "compare_cmd", "eval_cmd", "report_cmd", "bench_cmd", "calibrate_cmd", "models_cmd",
                   "env_cmd")


class SagegenGroup(TyperGroup):
    """Strips ``--debug`` from anywhere on the line and prints click's usage errors as one line (exit 2)."""

    def list_commands(self, ctx):  # registration order, not alphabetical
        return list(self.commands)

    def get_params(self, ctx):
        params = super().get_params(ctx)
        helpfmt.tidy(params, ctx)
        return params

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            helpfmt.tidy(command.get_params(ctx), ctx)
        return command

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        args, debug = errors.strip_debug(args)
        errors.set_debug(debug)
        from sagegen.cli.options import set_invocation

        set_invocation(args + (["--debug"] if debug else []))
        if not standalone_mode:
            return super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=False, **extra)
        try:
            rv = super().main(args=args, prog_name=prog_name or "sagegen", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except errors.ClickException as e:
            errors.show_click_error(e)
            sys.exit(e.exit_code)
        except typer.Abort:
            errors.print_error("aborted")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    name="sagegen",
    cls=SagegenGroup,
    help="sagegen: SageAttention2-style quantized attention (INT8 Q·Kᵀ, FP8 P·V) for diffusers video and "
         "image models. Generate, compare against the stock attention, evaluate and report.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from sagegen import __version__

        typer.echo(f"sagegen {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors (also SAGEGEN_DEBUG=1); "
                                                      "accepted anywhere on the command line."),
    version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                 help="Print sagegen's version and exit."),
) -> None:
    """sagegen command line."""


def _stand_in(name: str, problem: BaseException):
    def command() -> None:
        errors.print_error(f"`sagegen {name}` is unavailable: {errors.describe(problem)} (the module "
                           f"sagegen/cli/{name}_cmd.py failed to import)")
        raise typer.Exit(1)

    command.__doc__ = f"(unavailable: {errors.describe(problem)})"
    return command


def register_commands(target: typer.Typer, modules=COMMAND_MODULES) -> list[str]:
    """Import each command module that exists and let it register itself; returns what was registered."""
    done = []
    for mod in modules:
        qualified = f"{__package__}.{mod}"
        try:
            module = importlib.import_module(qualified)
        except ModuleNotFoundError as e:
            if e.name == qualified:
                continue  # not written yet
            target.command(mod.removesuffix("_cmd"))(_stand_in(mod.removesuffix("_cmd"), e))
            done.append(mod)
            continue
        except Exception as e:  # noqa: BLE001 - a broken module must not take the whole CLI down
            target.command(mod.removesuffix("_cmd"))(_stand_in(mod.removesuffix("_cmd"), e))
            done.append(mod)
            continue
        module.register(target)
        done.append(mod)
    return done


register_commands(app)


def main() -> None:
    """Console-script entry point (``sagegen``)."""
    app()


if __name__ == "__main__":
    main()
