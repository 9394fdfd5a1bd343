"""Workers of the CFG-parallelism tests: a tiny real pipeline, patched with sagegen (the emulation), run on 2 or 4
gloo processes with its guidance branches split (and Ulysses inside each branch on 4), against the same pipeline
in one process. Started with torch.multiprocessing's spawn."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from tests.support.cp import _exit_cleanly, _leave, cpu_device_count_one, init_gloo, write_result

STEPS = 2


def _pipeline(kind: str):
    from sagegen.models import tiny, tiny_video

    if kind in tiny.TINY_FAMILIES:
        return tiny.build_tiny_pipeline(kind, dtype=torch.bfloat16), dict(tiny.TINY_CALL_DEFAULTS[kind])
    return (tiny_video.build_tiny_video_pipeline(kind, dtype=torch.bfloat16),
            dict(tiny_video.TINY_VIDEO_CALL_DEFAULTS[kind]))


def generate(kind: str, seed: int, split=None) -> tuple[torch.Tensor, dict]:
    """The final latents of ``kind``'s tiny pipeline, patched with sagegen; ``split``: (cfg, ulysses) over the
    process group."""
    import sagegen
    from sagegen.patch.cp.cfg import disable, enable_cfg_parallel

    pipe, call = _pipeline(kind)
    call.update(num_inference_steps=STEPS, output_type="latent")
    sagegen.patch(pipe, backend="reference")
    state = None
    if split is not None:
        cfg, ulysses = split
        state = enable_cfg_parallel(pipe, cfg=cfg, ulysses=ulysses, guidance=call.get("guidance_scale"))
    with torch.inference_mode():
        out = pipe(prompt="a red fox in the snow", negative_prompt="blurry",
                   generator=torch.Generator().manual_seed(seed), **call)
    latents = out[0]
    info = {"context_parallel": getattr(pipe.transformer, "_parallel_config", None) is not None,
            "style": getattr(state, "style", None), "gathers": getattr(state, "gathers", 0)}
    if state is not None:
        disable([m for m in (pipe.transformer, getattr(pipe, "transformer_2", None)) if m is not None])
    return latents.float(), info


def worker(rank: int, world: int, kind: str, ulysses: int, init_file: str, out_path: str, seed: int) -> None:
    cpu_device_count_one()
    init_gloo(rank, world, init_file)
    try:
        split, info = generate(kind, seed, split=(2, ulysses))
        gathered = [torch.empty_like(split) for _ in range(world)]
        dist.all_gather(gathered, split.contiguous())
        if rank == 0:
            single, _ = generate(kind, seed)
            same_everywhere = all(torch.equal(g, gathered[0]) for g in gathered)
            diff = (split - single).abs()
            write_result(out_path, {"equal": bool(torch.equal(split, single)), "same_on_every_rank": same_everywhere,
                                    "rel_l1": float(diff.sum() / single.abs().sum()), "nan": int(split.isnan().sum()),
                                    "shape": list(split.shape), **info})
    finally:
        _leave()
    _exit_cleanly()


def run(tmp_path: Path, kind: str, ulysses: int = 1, seed: int = 0) -> dict:
    import torch.multiprocessing as mp

    world = 2 * ulysses
    out = tmp_path / f"cfg_{kind}_u{ulysses}.json"
    mp.spawn(worker, args=(world, kind, ulysses, str(tmp_path / "pg_init"), str(out), seed), nprocs=world, join=True)
    return json.loads(out.read_text())
