"""Helpers for the context-parallel tests: gloo process groups on the CPU, diffusers' CP config and mesh,
an exact fp64 attention, and the cases the workers run. Workers are started with torch.multiprocessing's
spawn, which imports this module in the children (the parent's sys.path travels with them)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

B, H, D = 2, 6, 64     # 6 heads: Ulysses over 2 and 3 ranks


def init_gloo(rank: int, world: int, init_file: str, cuda: bool = False) -> None:
    # "cpu:gloo": diffusers' "anything" modes pick the device of their size exchange from this string
    backend = "cpu:gloo,cuda:nccl" if cuda else "cpu:gloo"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)


def _leave() -> None:
    """Every rank waits for the others, then tears down: a gloo rank that exits while a peer still works
    sometimes aborts ("terminate called without an active exception", seen at 3 ranks)."""
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _exit_cleanly() -> None:
    """End a worker that finished (results written atomically, process group torn down) without the
    interpreter's shutdown: there a gloo thread still alive sometimes aborts the process (SIGABRT, "terminate
    called without an active exception"; 2 of 7 full test rounds of test_ulysses_2 under load, with correct
    results already on disk). A worker that raised never gets here, so its error still reaches mp.spawn."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cpu_device_count_one() -> None:
    """diffusers computes ``rank % torch.accelerator.device_count()`` for its device, which is 0 on a CPU-only
    host; give it one device."""
    torch.accelerator.device_count = lambda: 1


def parallel_config(ulysses: int, ring: int, device_type: str = "cpu"):
    """diffusers' ParallelConfig for (ulysses, ring), set up on a CPU mesh as enable_parallelism would."""
    from diffusers import ContextParallelConfig
    from diffusers.models._modeling_parallel import ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    cp = ContextParallelConfig(ulysses_degree=ulysses, ring_degree=ring)
    pc = ParallelConfig(context_parallel_config=cp)
    mesh = init_device_mesh(device_type, (ring, ulysses), mesh_dim_names=("ring", "ulysses"))
    pc.setup(dist.get_rank(), dist.get_world_size(), torch.device(device_type), mesh=mesh)
    return pc


def exact_attention(q, k, v, mask, scale):
    """fp64 attention on [B, S, H, D] tensors; rows with every key masked give zeros (as sagegen)."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ v).transpose(1, 2)


def rel_l1(a, b) -> float:
    return float((a.double() - b.double()).abs().sum() / b.double().abs().sum().clamp_min(1e-30))


def record_errors(res: dict, name, cp, single, exact) -> None:
    """rel-L1 of the CP output against one process and against stock, and of one process against stock."""
    res[f"rel_l1_cp_vs_single_{name}"] = rel_l1(cp, single)
    res[f"rel_l1_single_vs_stock_{name}"] = rel_l1(single, exact)
    res[f"rel_l1_cp_vs_stock_{name}"] = rel_l1(cp, exact)


def make_case(name: str, s: int, gen: torch.Generator):
    """Global q, k, v [B, S, H, D] bf16 and the global mask of case ``name`` (None, or [B|1, H|1, S|1, S])."""
    q, k, v = (torch.randn(B, s, H, D, generator=gen).bfloat16() for _ in range(3))
    keys = torch.arange(s)
    if name == "none":
        return q, k, v, None
    if name in ("keypad", "keypad_2d", "keypad_global"):
        # batch 0 keeps the first 60% of keys: at 3 ranks its last chunk is fully masked (defect c)
        keep = torch.tensor([int(0.6 * s), s - 5])
        return q, k, v, (keys[None, :] < keep[:, None])[:, None, None, :]
    if name == "additive":
        bias = torch.randn(B, 1, 1, s, generator=gen)
        bias[0, ..., int(0.6 * s):] = -math.inf
        return q, k, v, bias
    if name == "perhead":
        m = torch.rand(B, H, 1, s, generator=gen) < 0.7
        m[:, :, :, 0] = True
        return q, k, v, m
    if name == "query_mask":
        return q, k, v, torch.rand(B, 1, s, s, generator=gen) < 0.8
    if name == "masked_row":
        m = torch.ones(B, 1, 1, s, dtype=torch.bool)
        m[1] = False               # batch 1 sees no key at all: zeros (and lse -inf)
        return q, k, v, m
    raise ValueError(name)


CASES = ("none", "keypad", "keypad_2d", "keypad_global", "additive", "perhead", "query_mask", "masked_row")


def local_mask(name: str, mask, rank: int, world: int, s: int):
    """The mask as a model under CP hands it to the backend on ``rank``."""
    if mask is None:
        return None
    sl = s // world
    part = slice(rank * sl, (rank + 1) * sl)
    if name == "keypad_global":
        return mask                                  # already over the global keys
    if name == "keypad_2d":
        return mask[:, 0, 0, part]                   # diffusers' [B, S_kv] form
    if name == "query_mask":
        return mask[:, :, part, :]                   # local queries, global keys
    return mask[..., part]                           # local keys


def worker(rank: int, world: int, ulysses: int, ring: int, init_file: str, out_path: str, seed: int, s: int,
           cuda: bool = False, one_call: bool = False) -> None:
    """``one_call``: Ring attends once over the gathered keys (``ring_one_call``); every rank checks the query
    offset its local call got (ring super-chunk ring_rank of U local chunks)."""
    from sagegen.parallel import context_parallel_attention, sagegen_local_attention

    init_gloo(rank, world, init_file, cuda)
    try:
        pc = parallel_config(ulysses, ring, "cuda" if cuda else "cpu")
        local = sagegen_local_attention(backend="triton" if cuda else "reference")
        offsets = []

        def local_call(q, k, v, attn_mask=None, scale=None, return_lse=False, q_offset=None):
            offsets.append((q_offset, k.shape[1]))
            return local(q, k, v, attn_mask, scale, return_lse, q_offset=q_offset)
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
        scale = D ** -0.5
        results = {}
        for name in CASES:
            gen = torch.Generator().manual_seed(seed + CASES.index(name))
            q, k, v, mask = make_case(name, s, gen)
            q, k, v = q.to(dev), k.to(dev), v.to(dev)
            mask = mask.to(dev) if mask is not None else None
            sl = s // world
            part = slice(rank * sl, (rank + 1) * sl)
            out, lse = context_parallel_attention(
                q[:, part], k[:, part], v[:, part], attn_mask=local_mask(name, mask, rank, world, s),
                scale=scale, return_lse=True, parallel_config=pc, local_attention=local_call, ring_one_call=one_call)
            outs = [torch.empty_like(out) for _ in range(world)]
            lses = [torch.empty_like(lse) for _ in range(world)]
            dist.all_gather(outs, out.contiguous())
            dist.all_gather(lses, lse.contiguous())
            if rank == 0:
                cp_out, cp_lse = torch.cat(outs, 1), torch.cat(lses, 1)
                one_out, one_lse = local(q, k, v, mask, scale, True)
                exact = exact_attention(q, k, v, mask, scale)
                finite = torch.isfinite(one_lse)
                results[name] = {
                    "nan": int(cp_out.isnan().sum() + cp_lse.isnan().sum()),
                    "max_abs_vs_single": float((cp_out.float() - one_out.float()).abs().max()),
                    "rel_l1_vs_single": rel_l1(cp_out, one_out),
                    "rel_l1_cp_vs_exact": rel_l1(cp_out, exact),
                    "rel_l1_single_vs_exact": rel_l1(one_out, exact),
                    "lse_max_abs": float((cp_lse[finite] - one_lse[finite]).abs().max()),
                    "lse_inf_match": bool(torch.equal(torch.isfinite(cp_lse), finite)),
                }
        offsets_seen = [None] * world
        dist.all_gather_object(offsets_seen, sorted(set(offsets)))
        if rank == 0:
            results["local_calls"] = offsets_seen  # per rank: the (q_offset, keys) its local calls got
            tmp = Path(out_path).with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=1))
            os.replace(tmp, out_path)
    finally:
        _leave()
    _exit_cleanly()


def spawn_ranks(target, tmp_path: Path, name: str, ulysses: int, ring: int, seed: int, *extra) -> dict:
    """Run ``target(rank, world, ulysses, ring, init_file, out_path, seed, *extra)`` on ulysses x ring gloo
    processes; returns what rank 0 wrote."""
    import torch.multiprocessing as mp

    out = tmp_path / f"{name}_u{ulysses}_r{ring}.json"
    mp.spawn(target, args=(ulysses * ring, ulysses, ring, str(tmp_path / "pg_init"), str(out), seed, *extra),
             nprocs=ulysses * ring, join=True)
    return json.loads(out.read_text())


def run_topology(tmp_path: Path, ulysses: int, ring: int, seed: int, s: int = 96, cuda: bool = False,
                 one_call: bool = False) -> dict:
    return spawn_ranks(worker, tmp_path, "cp", ulysses, ring, seed, s, cuda, one_call)


SEGMENT_CASES = ("none", "keypad", "additive", "perhead", "query_mask")


def segments_worker(rank: int, world: int, ulysses: int, ring: int, init_file: str, out_path: str, seed: int,
                    s: int, segments: tuple[int, int], in_order: bool = False, part_calls: bool = True) -> None:
    """`context_parallel_attention(..., segments=)`: every rank holds (video, text) parts of a sequence whose
    one-process order is [all video, all text] (HunyuanVideo's joint call; text padding at the very end, so in
    the ranks' chunk order it sits in the middle). Rank 0 writes the CP output, put back in one-process order,
    against one process's sagegen attention on that order. ``in_order``: Ring attends once with
    ``ring_in_order`` (and ``ring_part_calls=part_calls``); every rank records its local calls (q_offset,
    queries, whether the keys it got are one process's, for its heads, call_rows), and the LSE is compared too."""
    from sagegen.parallel import context_parallel_attention, sagegen_local_attention

    init_gloo(rank, world, init_file)
    try:
        pc = parallel_config(ulysses, ring)
        local = sagegen_local_attention(backend="reference")
        scale = D ** -0.5
        a, b = segments
        calls, current = [], {}
        heads = slice((rank % ulysses) * H // ulysses, (rank % ulysses + 1) * H // ulysses)  # its Ulysses heads

        def local_call(q, k, v, attn_mask=None, scale=None, return_lse=False, q_offset=None, call_rows=None):
            calls.append((q_offset, q.shape[1], bool(torch.equal(k, current["k"][:, :, heads])), call_rows))
            return local(q, k, v, attn_mask, scale, return_lse, q_offset=q_offset, call_rows=call_rows)
        own = [torch.cat([torch.arange(r * a, (r + 1) * a), torch.arange(world * a + r * b, world * a + (r + 1) * b)])
               for r in range(world)]
        chunk_order = torch.cat(own)  # the global keys as the ranks' chunks follow each other
        results = {}
        for name in SEGMENT_CASES:
            q, k, v, mask = make_case(name, s, torch.Generator().manual_seed(seed + SEGMENT_CASES.index(name)))
            mine = own[rank]
            if mask is None:
                local_m = None
            elif name == "query_mask":  # this rank's query rows, every key (in chunk order)
                local_m = mask[:, :, mine][..., chunk_order]
            else:
                local_m = mask[..., mine]
            current["k"] = k
            out, lse = context_parallel_attention(
                q[:, mine], k[:, mine], v[:, mine], attn_mask=local_m, scale=scale, return_lse=True,
                parallel_config=pc, local_attention=local_call if in_order else local, segments=segments,
                ring_one_call=in_order, ring_in_order=in_order, ring_part_calls=part_calls)
            outs, lses = [torch.empty_like(out) for _ in range(world)], [torch.empty_like(lse) for _ in range(world)]
            dist.all_gather(outs, out.contiguous())
            dist.all_gather(lses, lse.contiguous())
            if rank == 0:
                cp_out, cp_lse = torch.empty_like(q), torch.empty(q.shape[:3])
                cp_out[:, chunk_order], cp_lse[:, chunk_order] = torch.cat(outs, 1), torch.cat(lses, 1)
                one_out, one_lse = local(q, k, v, mask, scale, True)
                results[name] = {"nan": int(cp_out.isnan().sum()), "equal": bool(torch.equal(cp_out, one_out)),
                                 "lse_equal": bool(torch.equal(cp_lse, one_lse)),
                                 "lse_max_diff": float((cp_lse - one_lse).abs().nan_to_num(0.0).max()),
                                 "rel_l1_vs_single": rel_l1(cp_out, one_out),
                                 "rel_l1_cp_vs_exact": rel_l1(cp_out, exact_attention(q, k, v, mask, scale)),
                                 "rel_l1_single_vs_exact": rel_l1(one_out, exact_attention(q, k, v, mask, scale))}
        seen = [None] * world
        dist.all_gather_object(seen, sorted(set(calls)))
        results["local_calls"] = seen
        try:  # lengths that do not add up to the local sequence: refused before any collective
            context_parallel_attention(q[:, mine], k[:, mine], v[:, mine], attn_mask=None, scale=scale,
                                       return_lse=False, parallel_config=pc, local_attention=local,
                                       segments=(1, 2))
        except ValueError as exc:
            results["bad_segments_error"] = str(exc)
        if rank == 0:
            write_result(out_path, results)
    finally:
        _leave()
    _exit_cleanly()


def run_segments(tmp_path: Path, ulysses: int, ring: int, seed: int, s: int = 96,
                 segments: tuple[int, int] = (40, 8), in_order: bool = False, part_calls: bool = True) -> dict:
    return spawn_ranks(segments_worker, tmp_path, "segments", ulysses, ring, seed, s, segments, in_order,
                       part_calls)


# ---- end to end: a tiny diffusers transformer under enable_parallelism ------------------------------------

def register_test_backend() -> str:
    """sagegen's diffusers backend, on the emulation (fp32 models run it on a bf16 copy)."""
    from sagegen.jobs.cp_pipeline import sagegen_backend_name

    return sagegen_backend_name(backend="reference")


@contextlib.contextmanager
def full_precision_backend():
    """The "sagegen" backend with PyTorch SDPA as each chunk's attention (its full-precision mode)."""
    from sagegen.backend.attention import get_backend_config, restore_backend_config

    previous = get_backend_config()
    restore_backend_config(dataclasses.replace(previous, full_precision=True))
    try:
        yield
    finally:
        restore_backend_config(previous)


def model_inputs(family: str, gen: torch.Generator) -> dict:
    """Inputs of the tiny transformer of ``family`` (sagegen.models.tiny), sequence lengths divisible by 2-4."""
    from sagegen.models import tiny

    t = tiny._TEXT_HIDDEN
    if family == "flux":
        n, l = 48, 12
        ids = lambda m: torch.stack([torch.zeros(m), torch.arange(m) // 8, torch.arange(m) % 8], -1).float()
        return dict(hidden_states=torch.randn(1, n, 16, generator=gen),
                    encoder_hidden_states=torch.randn(1, l, 32, generator=gen),
                    pooled_projections=torch.randn(1, t, generator=gen), timestep=torch.tensor([0.5]),
                    img_ids=ids(n), txt_ids=torch.zeros(l, 3), guidance=torch.tensor([3.5]), return_dict=False)
    if family == "hunyuanvideo":
        l = 12
        mask = torch.zeros(2, l)
        mask[0, :7] = 1           # at 2 ranks the text chunk of rank 1 is part padding, at 4 ranks wholly padding
        mask[1, :12] = 1
        return dict(hidden_states=torch.randn(2, 4, 2, 8, 8, generator=gen), timestep=torch.tensor([500, 500]),
                    encoder_hidden_states=torch.randn(2, l, t, generator=gen), encoder_attention_mask=mask,
                    pooled_projections=torch.randn(2, t, generator=gen), guidance=torch.tensor([3500.0, 3500.0]),
                    return_dict=False)
    if family == "hunyuanvideo_long":
        # 256 video tokens: two 128-key quantization blocks, so keys that land in other K blocks under a split
        # show here, where the case above fits in one block
        l = 14
        mask = torch.zeros(2, l)
        mask[0, :7] = 1
        mask[1, :14] = 1
        return dict(hidden_states=torch.randn(2, 4, 4, 16, 16, generator=gen), timestep=torch.tensor([500, 500]),
                    encoder_hidden_states=torch.randn(2, l, t, generator=gen), encoder_attention_mask=mask,
                    pooled_projections=torch.randn(2, t, generator=gen), guidance=torch.tensor([3500.0, 3500.0]),
                    return_dict=False)
    if family in ("hunyuanvideo15", "hunyuanvideo15_i2v"):
        # text = 5 image + 6 ByT5 + 12 Qwen tokens = 23: the CP hook pads it to 24 (a multiple of 2 and 4).
        # After the model's reorder (valid tokens first) batch 0 holds 3 + 8 valid tokens (t2v): at 2 ranks
        # rank 1's text is wholly padding, at 4 ranks ranks 2 and 3's are.
        mask, mask_2 = torch.zeros(2, 12, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long)
        mask[0, :8], mask[1, :12], mask_2[0, :3], mask_2[1, :5] = 1, 1, 1, 1
        image = (torch.randn(2, 5, 16, generator=gen) if family.endswith("i2v") else torch.zeros(2, 5, 16))
        return dict(hidden_states=torch.randn(2, 9, 2, 4, 4, generator=gen), timestep=torch.tensor([500.0, 500.0]),
                    encoder_hidden_states=torch.randn(2, 12, 32, generator=gen), encoder_attention_mask=mask,
                    encoder_hidden_states_2=torch.randn(2, 6, 16, generator=gen), encoder_attention_mask_2=mask_2,
                    image_embeds=image, return_dict=False)
    raise ValueError(family)


def build_model(family: str, seed: int):
    if family.startswith("hunyuanvideo15"):
        from sagegen.models.tiny_classes import build_tiny_class

        return build_tiny_class("hunyuanvideo15", seed=seed, dtype=torch.float32)
    from sagegen.models.tiny import build_tiny_transformer

    return build_tiny_transformer(family.removesuffix("_long"), seed=seed)


def write_result(out_path, res: dict) -> None:
    """Rank 0's results as JSON, atomically (the parent reads the file after the workers end)."""
    tmp = Path(out_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    os.replace(tmp, out_path)


def model_worker(rank, world, ulysses, ring, family, init_file, out_path, seed) -> None:
    from sagegen.patch.cp import enable_context_parallel

    cpu_device_count_one()
    init_gloo(rank, world, init_file)
    try:
        backend = register_test_backend()
        inputs = model_inputs(family, torch.Generator().manual_seed(seed))
        model = build_model(family, seed % 1000)
        with torch.no_grad():
            model.set_attention_backend("native")
            exact = model(**inputs)[0]
            model.set_attention_backend(backend)
            single = model(**inputs)[0]
            enable_context_parallel(model, ulysses=ulysses, ring=ring, backend=backend)
            cp = model(**inputs)[0]
            # the same split with exact attention on every chunk (sagegen's CP, full precision): equals the
            # one-process exact output to fp32 rounding, so a wrong mask or split shows well above sagegen's error
            with full_precision_backend():
                cp_full = model(**inputs)[0]
        if rank == 0:
            res = {"nan": int(cp.isnan().sum() + cp_full.isnan().sum()),
                   "rel_l1_cp_full_vs_exact": rel_l1(cp_full, exact), "rel_l1_vs_single": rel_l1(cp, single),
                   "rel_l1_cp_vs_exact": rel_l1(cp, exact), "rel_l1_single_vs_exact": rel_l1(single, exact)}
            write_result(out_path, res)
    finally:
        _leave()
    _exit_cleanly()


def run_model(tmp_path: Path, family: str, ulysses: int, ring: int, seed: int) -> dict:
    import torch.multiprocessing as mp

    world = ulysses * ring
    out = tmp_path / f"model_{family}_u{ulysses}_r{ring}.json"
    mp.spawn(model_worker, args=(world, ulysses, ring, family, str(tmp_path / "pg_init"), str(out), seed),
             nprocs=world, join=True)
    return json.loads(out.read_text())
