"""How options read in `--help`: typer 0.2x prints a type for every parameter (``<bool>`` after flags,
``<int range> [x>=1]``, ``<list[str]>``); sagegen shows a plain metavar instead (N, TEXT, PATH, a|b|c) and
nothing after a flag, which takes no value.

`tidy(params)` changes only how the parameters are displayed (per instance); parsing and validation,
ranges included, stay typer's.
"""

from __future__ import annotations

_TYPE_METAVARS = {"int": "N", "float": "NUMBER", "str": "TEXT", "Path": "PATH"}


def _plain_metavar(param, ctx) -> str | None:
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None  # a flag takes no value; --x/--no-x says it all
    if param.metavar is not None:
        return param.metavar
    label = param.display_type(ctx)  # e.g. "<int range>", "<a|b|c>", "<list[str]>", "<path>"
    inner = label.strip("<>") if label else ""
    if "|" in inner and "[" not in inner:
        return inner
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and getattr(desc, "is_path", False):
        return "PATH"
    for type_name, metavar in _TYPE_METAVARS.items():
        if type_name.lower() in inner.lower():
            return metavar
    return inner.upper() or None


def tidy(params, ctx) -> None:
    """Plain metavars for `params` (a command's `get_params(ctx)`); idempotent."""
    for param in params:
        if getattr(param, "_sagegen_tidy", False) or not hasattr(param, "display_type"):
            continue
        if param.param_type_name == "argument":
            param.display_type_rich = lambda ctx: None  # its name (MODEL, RUN_DIR) is the metavar
        else:
            text = _plain_metavar(param, ctx)
            param.display_type_rich = lambda ctx, text=text: text
        param._get_number_range_help_str = lambda: None  # the help text says the range where it matters
        param._sagegen_tidy = True
