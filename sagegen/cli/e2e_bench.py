"""``python bench/bench_e2e.py MODEL ...``: the options of the time-to-video benchmark, checked as `sagegen run`
checks them (sizes, memory, the cache and sparse specs) before anything loads; the measuring is
`sagegen.jobs.e2ebench`."""

from __future__ import annotations

import argparse
import sys

from sagegen.jobs.e2ebench import VARIANTS, run


def parser() -> argparse.ArgumentParser:
    """The benchmark's options (also what `sagegen bench MODEL --e2e` passes through)."""
    p = argparse.ArgumentParser(prog="bench_e2e", description="Time to video per variant (sagegen/jobs/e2ebench.py)")
    p.add_argument("model")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--cache", default=None, metavar="SPEC", help="also run each variant with this step cache")
    p.add_argument("--sparse", default=None, metavar="SPEC", help="block-sparse attention for the sagegen variant")
    p.add_argument("--compile", default="regional", choices=["regional", "none"],
                   help="compile the denoisers of sagegen and torchao (diffusers' compile_repeated_blocks)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--frames", type=int, default=None)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--backend", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--prompt", default="a red fox running through fresh snow, golden hour")
    p.add_argument("--out", required=True)
    return p


def parse(argv):
    """The options (argparse exits 2 on a bad one, naming it)."""
    p = parser()
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        p.error(f"--variants: {', '.join(unknown) or 'none given'}; choose from {', '.join(VARIANTS)}")
    return args


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    from sagegen.cli import jobs

    job, _ = jobs.build_job(
        model=args.model, variants=["sage"], prompt=[args.prompt], prompts=None, max_prompts=None, seed="0",
        steps=args.steps, frames=args.frames, height=args.height, width=args.width, guidance=None,
        negative_prompt=None, dtype="auto", device=args.device, model_path=None,
        random_weights=not args.model.startswith("tiny-"), offload="none", vae_tiling=False, vae_slicing=False,
        compile=False, warmup=0, kernel=None, fp_blocks=None, fp_first_steps=0, fp_last_steps=0,
        backend=args.backend, out=None, linear="fp8", sparse=args.sparse, cache=args.cache, cuda_graphs=False,
        writes_run_dir=False)
    return run(job, args, argv)
