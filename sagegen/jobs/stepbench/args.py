"""The options of `sagegen bench` (`sagegen.jobs.stepbench.bench`), parsed without torch: a mistake on the
command line is told at once, before torch and diffusers load (the regional-compile check alone imports diffusers)."""

from __future__ import annotations

import argparse
import json

from sagegen.models import arch as archs

DESCRIPTION = ("One denoising step of a full-size transformer with random weights: stock attention vs "
               "`sagegen.patch`.")
DTYPE_NAMES = ("bf16", "fp16")  # stepbench.DTYPES maps them to torch dtypes
SCOPES = ("full", "regional")   # how --compile compiles (sagegen.jobs.stepbench.compiling)


class BenchArgError(ValueError):
    """A benchmark option that does not parse; the message names it."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, raise_errors: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.raise_errors = raise_errors

    def error(self, message: str):
        if self.raise_errors:
            raise BenchArgError(message)
        super().error(message)


def parser(*, raise_errors: bool = False) -> argparse.ArgumentParser:
    """The benchmark's argument parser (its values are checked further by `parse_args`)."""
    p = _Parser(prog="sagegen bench", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                raise_errors=raise_errors)
    p.add_argument("model", choices=sorted(archs.ARCHS), metavar="MODEL",
                   help=f"architecture: {', '.join(archs.ARCHS)}")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--random-weights", action="store_true", default=True,
                   help="the architecture's full size with random weights (always: nothing is downloaded)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke mode (shrunk architecture, small inputs)")
    p.add_argument("--compile", action="store_true", help="also time torch.compile of both sides")
    p.add_argument("--compiled-only", action="store_true",
                   help="with --compile: time only stock eager (the reference) and the compiled variants")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--compile-scope", choices=SCOPES, default="full",
                   help="full: torch.compile(model); regional: diffusers' compile_repeated_blocks(fullgraph=True), "
                        "each repeated block compiled once (Flux, Wan, HunyuanVideo, ...: minutes less compiling)")
    p.add_argument("--compile-mode", default=None, choices=["default", "reduce-overhead", "max-autotune",
                                                            "max-autotune-no-cudagraphs"],
                   help="torch.compile mode for every compiled side (reduce-overhead: CUDA graphs)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=None, help="samples per step (default: the pipeline's CFG batch)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--frames", type=int, default=None)
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sage-config", default=None,
                   help='JSON object of SageConfig fields overriding DIFFUSION_CONFIG, e.g. \'{"smooth_v": false}\'')
    p.add_argument("--backend", choices=("auto", "triton"), default="auto",
                   help="sageattn backend for the patched runs (auto: SDPA below the measured crossover)")
    p.add_argument("--linear", choices=("fp8",), default=None,
                   help="also time sagegen attention + FP8 linears (variant sagegen_fp8, and sagegen_fp8_compiled "
                        "with --compile)")
    p.add_argument("--linear-policy", default=None,
                   help='JSON object of sagegen.linear.LinearPolicy fields, e.g. \'{"keep_blocks": [0]}\'')
    p.add_argument("--torchao", action="store_true",
                   help="also time torchao's float8 dynamic per-row quantization of the layers --linear fp8 "
                        "quantizes (variants torchao_fp8, sagegen_torchao_fp8; compiled with --compile)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also time the eager variants with each forward replayed as a CUDA graph (stock_graphs, "
                        "sagegen_graphs, sagegen_fp8_graphs with --linear; sagegen.patch(cuda_graphs=True))")
    p.add_argument("--no-zero-attention", action="store_true", help="skip the no_attention variant")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated variants to time besides the stock reference, among those the other "
                        "options enable (e.g. stock_compiled,sagegen_fp8_compiled,torchao_fp8_compiled): "
                        "fewer compiles when device time is short")
    p.add_argument("--sparse", action="append", default=[], metavar="SPEC",
                   help="also time sagegen with block-sparse attention (repeatable), e.g. topk=0.5, cdf=0.95, "
                        "sta, radial (docs/sparse.md); one step, so no dense first steps; the first block stays "
                        "dense unless blocks=none")
    p.add_argument("--profile", action="store_true",
                   help="also one profiled step of each eager side: GPU time by kernel group (attention, "
                        "quantization, the fused Q/K prologue, the rest)")
    return p


def parse_args(argv=None, *, raise_errors: bool = False):
    """The benchmark's options. A mistake prints argparse's usage and exits 2 (the script's way), or with
    ``raise_errors`` raises `BenchArgError` with the message alone (the typer CLI prints it as its own)."""
    p = parser(raise_errors=raise_errors)
    args = p.parse_args(argv)
    if args.compiled_only and not args.compile:
        p.error("--compiled-only needs --compile")
    if args.compile_scope == "regional":
        if not args.compile:
            p.error("--compile-scope regional needs --compile")
        from sagegen.jobs.stepbench.compiling import repeated_blocks

        cls = archs.get_arch(args.model).cls
        if not repeated_blocks(cls):
            p.error(f"--compile-scope regional: {cls} declares no _repeated_blocks in "
                    "this diffusers, so diffusers cannot compile it by region; use --compile-scope full")
    if args.warmup < 0 or args.repeats < 1:
        p.error("--warmup must be >= 0 and --repeats >= 1")
    for name in ("batch", "height", "width", "frames"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be >= 1")
    from sagegen.sparse.text import parse_sparse_arg

    specs = []
    for spec in args.sparse:
        try:
            specs.append((spec, parse_sparse_arg(spec).replace(dense_steps=0.0)))
        except ValueError as exc:
            p.error(f"--sparse {spec!r}: {exc}")
    args.sparse = specs
    enabled = enabled_variants(args)
    if args.only is not None:
        args.only = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = sorted(args.only - set(enabled))
        if unknown or not args.only:
            p.error(f"--only: {', '.join(unknown) or 'no names'} not among the variants these options enable "
                    f"({', '.join(enabled)}); --compile, --linear fp8, --torchao and --sparse enable more")
    if args.sage_config:
        try:
            args.sage_config = json.loads(args.sage_config)
        except json.JSONDecodeError as exc:
            p.error(f"--sage-config is not valid JSON: {exc}")
        if not isinstance(args.sage_config, dict):
            p.error("--sage-config must be a JSON object of SageConfig fields")
    if args.linear_policy:
        from sagegen.linear import LinearPolicy

        try:
            fields = json.loads(args.linear_policy)
            if not isinstance(fields, dict):
                raise ValueError("not a JSON object")
            args.linear_policy = LinearPolicy(**fields)
        except (ValueError, TypeError) as exc:
            p.error(f"--linear-policy: {exc}")
    return args


def enabled_variants(args) -> list[str]:
    """The variants (besides stock) that the options ask for, in the order they run."""
    eager = not args.compiled_only
    names = ["sagegen"] if eager else []
    names += [f"sagegen_sparse[{spec}]" for spec, _ in args.sparse] if eager else []
    names += ["no_attention"] if eager and not args.no_zero_attention else []
    names += ["sagegen_fp8"] if eager and args.linear else []
    if eager and args.cuda_graphs:
        names += ["stock_graphs", "sagegen_graphs"] + (["sagegen_fp8_graphs"] if args.linear else [])
    names += ["stock_compiled", "sagegen_compiled"] if args.compile else []
    names += ["sagegen_fp8_compiled"] if args.compile and args.linear else []
    for base in ("torchao_fp8", "sagegen_torchao_fp8") if args.torchao else ():
        names += ([base] if eager else []) + ([f"{base}_compiled"] if args.compile else [])
    return names
