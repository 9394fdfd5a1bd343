"""Workers for the context-parallel tests of `sagegen.patch` on tiny models (Wan, HunyuanVideo, HunyuanVideo-1.5,
Flux): one process against diffusers' split, with the patch's fused routes, FP8 linears and block-sparse policy.
Started with torch.multiprocessing's spawn, like `cp_support`'s workers."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support.cp import (_exit_cleanly, _leave, cpu_device_count_one, init_gloo, model_inputs, record_errors,
                              register_test_backend, rel_l1, spawn_ranks, write_result)


def wan_inputs(gen: torch.Generator, device="cpu", frames: int = 2, side: int = 8) -> dict:
    """A latent of frames x side/2 x side/2 tokens after patching (32 by default) and 16 text tokens for the
    tiny Wan transformer, bf16."""
    return dict(hidden_states=torch.randn(1, 16, frames, side, side, generator=gen).to(device, torch.bfloat16),
                timestep=torch.tensor([500.0], device=device),
                encoder_hidden_states=torch.randn(1, 16, 32, generator=gen).to(device, torch.bfloat16),
                return_dict=False)


def patched_wan_worker(rank, world, ulysses, ring, init_file, out_path, seed, cuda=False) -> None:
    """`sagegen.patch` (fused prologues and blocks; then with FP8 linears too) on the tiny Wan transformer, in one
    process and under diffusers' context parallelism; rank 0 writes the differences and the patch's counters."""
    import sagegen
    from sagegen.models.tiny_video import build_tiny_wan_transformer
    from sagegen.patch.cp import enable_context_parallel
    from sagegen.patch.cp.enable import keeping_global_backend
    from sagegen.patch import fp8_handoff as _fp8_out
    from sagegen.patch import patch_info

    # one process's output projections would take an FP8 attention output, which CP does not: compare like
    # with like (docs/context-parallel.md)
    _fp8_out.ENABLED = False

    if not cuda:
        cpu_device_count_one()
    init_gloo(rank, world, init_file, cuda=cuda)
    try:
        backend = register_test_backend()
        device = f"cuda:{rank}" if cuda else "cpu"
        # on the GPU: 1,280 video tokens, so the kernels' blocks (and the split between ranks) matter
        size = dict(frames=5, side=32) if cuda else {}
        inputs = wan_inputs(torch.Generator().manual_seed(seed), device, **size)
        model = build_tiny_wan_transformer(dtype=torch.bfloat16, seed=seed % 100).to(device)
        kernel = "triton" if cuda else "reference"  # (auto would run SDPA at this size on one process)
        res = {}
        with torch.no_grad():
            exact = model(**inputs)[0]
            outs = {}
            # sagegen's diffusers backend chosen on the model first: the patch still fuses and routes with its
            # own settings (the same output as from the native backend below)
            with keeping_global_backend():
                model.set_attention_backend(backend)
            with sagegen.patched(model, backend=kernel):
                outs["backend_chosen"] = model(**inputs)[0]
                res["stats_backend_chosen"] = dict(patch_info(model)["stats"])
            model.reset_attention_backend()
            for cp in (False, True):
                if cp:
                    enable_context_parallel(model, ulysses=ulysses, ring=ring, backend=backend)
                for linear in (None, "fp8"):
                    # every block's linears in FP8, whatever the (tiny) token count
                    extra = {"linear_policy": sagegen.LinearPolicy(keep_blocks=(), min_rows=1)} if linear else {}
                    with sagegen.patched(model, backend=kernel, linear=linear, **extra):
                        outs[(cp, linear)] = model(**inputs)[0]
                        info = patch_info(model)
                        res[f"stats_cp{int(cp)}_{linear}"] = dict(info["stats"])
                        if linear:
                            res[f"fp8_calls_cp{int(cp)}"] = info["linear"]["fp8_calls"]
        # block-sparse (top-k 0.5, every step and block, self-attention) on a 512-token latent: 8 key blocks of 64
        from sagegen.patch import sparse_density
        from sagegen.sparse.text import parse_sparse_arg

        sparse = parse_sparse_arg("topk=0.5,steps=0,blocks=none,min_tokens=0")
        big = wan_inputs(torch.Generator().manual_seed(seed + 1), device, frames=2, side=32)
        model = build_tiny_wan_transformer(dtype=torch.bfloat16, seed=seed % 100).to(device)
        with torch.no_grad():
            sparse_outs = {"exact": model(**big)[0]}
            for cp in (False, True):
                if cp:
                    enable_context_parallel(model, ulysses=ulysses, ring=ring, backend=backend)
                for name, kw in (("dense", {}), ("sparse", {"sparse": sparse})):
                    with sagegen.patched(model, backend=kernel, **kw):
                        sparse_outs[(cp, name)] = model(**big)[0]
                        res[f"stats_cp{int(cp)}_{name}"] = dict(patch_info(model)["stats"])
                        if kw:
                            res[f"density_cp{int(cp)}"] = sparse_density(model)["overall"]
        if rank == 0:
            res["backend_chosen_equal"] = bool(torch.equal(outs["backend_chosen"], outs[(False, None)]))
            res["rel_l1_sparse_vs_dense"] = rel_l1(sparse_outs[(False, "sparse")], sparse_outs[(False, "dense")])
            for name in ("dense", "sparse"):
                record_errors(res, name, sparse_outs[(True, name)], sparse_outs[(False, name)], sparse_outs["exact"])
            for linear in (None, "fp8"):
                record_errors(res, linear, outs[(True, linear)], outs[(False, linear)], exact)
            res["nan"] = int(sum(o.isnan().sum() for o in outs.values()))
            res["layers"] = len(model.blocks)
            write_result(out_path, res)
    finally:
        _leave()
    _exit_cleanly()


def run_patched_wan(tmp_path: Path, ulysses: int, ring: int, seed: int, cuda: bool = False) -> dict:
    return spawn_ranks(patched_wan_worker, tmp_path, "patched_wan", ulysses, ring, seed, cuda)


def hunyuan_inputs(gen: torch.Generator, device="cpu", side: int = 8) -> dict:
    """`model_inputs("hunyuanvideo")` in bf16 on ``device``; ``side``: the latent's height and width (2 frames,
    patch 2: 2·side²/4 video tokens, and 12 text tokens, 7 valid in sample 0)."""
    inputs = model_inputs("hunyuanvideo", gen)
    if side != 8:
        inputs["hidden_states"] = torch.randn(2, 4, 2, side, side, generator=gen)
    return {k: (v.to(device, torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point()
                and k in ("hidden_states", "encoder_hidden_states", "pooled_projections") else
                v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _text_kept(bs, n: int, video: int) -> bool:
    """Whether every query block of a BlockSparse computes every key block holding text (tokens video..n, as
    one process orders a joint [video, text] call)."""
    text_blocks = {t // bs.block_kv for t in range(video, n)}
    counts, idx = bs.counts.cpu(), bs.indices.cpu()
    for pos in torch.cartesian_prod(*(torch.arange(s) for s in counts.shape)).tolist():
        listed = set(idx[tuple(pos)][:int(counts[tuple(pos)])].tolist())
        if not text_blocks <= listed:
            return False
    return True


def patched_hunyuan_worker(rank, world, ulysses, ring, init_file, out_path, seed, cuda=False, dense_side=8) -> None:
    """`sagegen.patch` on the tiny HunyuanVideo transformer (bf16) in one process and under context parallelism
    (sagegen's plan and mask hooks): the fused joint prologue on every joint call, FP8 linears with the single
    block's fused cat-GELU projection, and block-sparse attention with the text kept (under Ulysses the joint
    call's segments put every rank's video, then every rank's text, in one process's order); rank 0 writes the
    differences and counters."""
    import sagegen
    from sagegen.linear.module import FP8Linear
    from sagegen.models.tiny import build_tiny_transformer
    from sagegen.patch.cp import enable_context_parallel
    from sagegen.patch import fp8_handoff as _fp8_out
    from sagegen.patch import patch_info, sparse_density, sparse_policy
    from sagegen.sparse.text import parse_sparse_arg

    # one process's output projections would take an FP8 attention output, which CP does not: compare like
    # with like (docs/context-parallel.md)
    _fp8_out.ENABLED = False

    if not cuda:
        cpu_device_count_one()
    init_gloo(rank, world, init_file, cuda=cuda)
    try:
        backend = register_test_backend()
        device = f"cuda:{rank}" if cuda else "cpu"
        kernel = "triton" if cuda else "reference"
        cat_gelu_calls = [0]
        stock_cat_gelu = FP8Linear.cat_gelu

        def counting_cat_gelu(self, prefix, x):
            cat_gelu_calls[0] += 1
            return stock_cat_gelu(self, prefix, x)
        FP8Linear.cat_gelu = counting_cat_gelu
        text_ok = []
        stock_block_mask_for = sparse_policy.block_mask_for

        def checking_block_mask_for(session, q, k, attn_mask, scale, **kw):
            bs = stock_block_mask_for(session, q, k, attn_mask, scale, **kw)
            if bs is not None:
                text_ok.append(_text_kept(bs, k.shape[2], k.shape[2] - 12))  # 12 text tokens in all
            return bs
        sparse_policy.block_mask_for = checking_block_mask_for

        res, outs = {}, {}
        for name, side in (("dense", dense_side), ("sparse", 32)):
            inputs = hunyuan_inputs(torch.Generator().manual_seed(seed), device, side)
            model = build_tiny_transformer("hunyuanvideo", seed=seed % 100, dtype=torch.bfloat16).to(device)
            with torch.no_grad():
                outs[(name, "exact")] = model(**inputs)[0]
                for cp in (False, True):
                    if cp:
                        enable_context_parallel(model, ulysses=ulysses, ring=ring, backend=backend)
                        outs[(name, "cp_before")] = model(**inputs)[0]
                    variants = ((None, {}), ("fp8", {"linear": "fp8", "linear_policy": sagegen.LinearPolicy(
                        keep_blocks=(), min_rows=1)})) if name == "dense" else (
                        ("sparse", {"sparse": parse_sparse_arg("topk=0.5,steps=0,blocks=none,min_tokens=0")}),)
                    for variant, kw in variants:
                        cat_gelu_calls[0] = 0
                        text_ok.clear()
                        with sagegen.patched(model, backend=kernel, **kw):
                            outs[(name, cp, variant)] = model(**inputs)[0]
                            info = patch_info(model)
                            res[f"stats_cp{int(cp)}_{variant}"] = dict(info["stats"])
                            if variant == "fp8":
                                res[f"cat_gelu_cp{int(cp)}"] = cat_gelu_calls[0]
                                res[f"fp8_calls_cp{int(cp)}"] = info["linear"]["fp8_calls"]
                            if variant == "sparse":
                                res[f"density_cp{int(cp)}"] = sparse_density(model)["overall"]
                                res[f"text_kept_cp{int(cp)}"] = [bool(t) for t in text_ok]
                    if cp:  # unpatched under CP: the stock forward again (the mask hooks' references restored)
                        outs[(name, "cp_unpatched")] = model(**inputs)[0]
        if rank == 0:
            for variant in (None, "fp8", "sparse"):
                name = "sparse" if variant == "sparse" else "dense"
                record_errors(res, variant, outs[(name, True, variant)], outs[(name, False, variant)],
                              outs[(name, "exact")])
            res["unpatch_equal_under_cp"] = all(bool(torch.equal(outs[(n, "cp_unpatched")], outs[(n, "cp_before")]))
                                                for n in ("dense", "sparse"))
            res["nan"] = int(sum(o.isnan().sum() for o in outs.values()))
            write_result(out_path, res)
    finally:
        _leave()
    _exit_cleanly()


def run_patched_hunyuan(tmp_path: Path, ulysses: int, ring: int, seed: int, cuda: bool = False,
                        dense_side: int = 8) -> dict:
    """``dense_side``: the dense runs' latent side (8: 44 tokens, one key block; 16: 140, where key order moves
    keys between quantization blocks)."""
    return spawn_ranks(patched_hunyuan_worker, tmp_path, "patched_hunyuan", ulysses, ring, seed, cuda, dense_side)


def patched_flux_worker(rank, world, ulysses, ring, init_file, out_path, seed, cuda=False) -> None:
    """`sagegen.patch` on the tiny Flux transformer (bf16; diffusers' own plan) in one process and under context
    parallelism: the fused joint prologue ([text, image] with rotary embeddings) on every joint call, with the
    parts' lengths handed to the split (the single block's from its text length)."""
    import sagegen
    from sagegen.models.tiny import build_tiny_transformer
    from sagegen.patch.cp import enable_context_parallel
    from sagegen.patch import fp8_handoff as _fp8_out
    from sagegen.patch import patch_info

    # one process's output projections would take an FP8 attention output, which CP does not: compare like
    # with like (docs/context-parallel.md)
    _fp8_out.ENABLED = False

    if not cuda:
        cpu_device_count_one()
    init_gloo(rank, world, init_file, cuda=cuda)
    try:
        backend = register_test_backend()
        device, kernel = (f"cuda:{rank}", "triton") if cuda else ("cpu", "reference")
        gen = torch.Generator().manual_seed(seed)
        inputs = model_inputs("flux", gen)
        # 256 image tokens (16 x 16): the kernels' 64-key blocks see the split's token order
        inputs.update(hidden_states=torch.randn(1, 256, 16, generator=gen), img_ids=torch.stack(
            [torch.zeros(256), torch.arange(256) // 16, torch.arange(256) % 16], -1).float())
        inputs = {k: (v.to(device, torch.bfloat16) if k in ("hidden_states", "encoder_hidden_states",
                                                             "pooled_projections")
                      else v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        model = build_tiny_transformer("flux", seed=seed % 100, dtype=torch.bfloat16).to(device)
        res, outs = {}, {}
        with torch.no_grad():
            exact = model(**inputs)[0]
            for cp in (False, True):
                if cp:
                    enable_context_parallel(model, ulysses=ulysses, ring=ring, backend=backend)
                with sagegen.patched(model, backend=kernel):
                    outs[cp] = model(**inputs)[0]
                    res[f"stats_cp{int(cp)}"] = dict(patch_info(model)["stats"])
        if rank == 0:
            res.update(rel_l1_single_vs_stock=rel_l1(outs[False], exact), rel_l1_cp_vs_stock=rel_l1(outs[True], exact),
                       rel_l1_cp_vs_single=rel_l1(outs[True], outs[False]),
                       nan=int(sum(o.isnan().sum() for o in outs.values())))
            write_result(out_path, res)
    finally:
        _leave()
    _exit_cleanly()


def run_patched_flux(tmp_path: Path, ulysses: int, ring: int, seed: int, cuda: bool = False) -> dict:
    return spawn_ranks(patched_flux_worker, tmp_path, "patched_flux", ulysses, ring, seed, cuda)
