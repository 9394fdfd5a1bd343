"""Workers for the context-parallel tests of `sagegen.patch` on the models whose attention takes the patch's
backend route (HunyuanVideo-1.5, LTX-Video, Qwen-Image): one process against diffusers' split, dense and
block-sparse. Started with torch.multiprocessing's spawn, like `cp_support`'s workers."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support.cp_patched import _text_kept
from tests.support.cp import (_exit_cleanly, _leave, cpu_device_count_one, init_gloo, model_inputs, record_errors,
                              register_test_backend, rel_l1, spawn_ranks, write_result)


def _setup(rank, world, init_file, cuda):
    """(diffusers' test backend, device, sagegen kernel backend) for this rank."""
    if not cuda:
        cpu_device_count_one()
    init_gloo(rank, world, init_file, cuda=cuda)
    device, kernel = (f"cuda:{rank}", "triton") if cuda else ("cpu", "reference")
    return register_test_backend(), device, kernel


def _patched_runs(model, inputs, ulysses, ring, backend, kernel, variants, on_variant=None):
    """Outputs of the model patched with each of ``variants`` ({name: patch kwargs}), in one process (cp False)
    and under the split (cp True), and stock's ("exact"); ``res`` with each run's patch counters (and, for
    sparse variants, the density). ``on_variant(cp, name, res)`` runs inside each patch, after the call."""
    import sagegen
    from sagegen.patch.cp import enable_context_parallel
    from sagegen.patch import patch_info, sparse_density

    res, outs = {}, {}
    with torch.no_grad():
        outs["exact"] = model(**inputs)[0]
        for cp in (False, True):
            if cp:
                enable_context_parallel(model, ulysses=ulysses, ring=ring, backend=backend)
            for name, kw in variants.items():
                with sagegen.patched(model, backend=kernel, **kw):
                    outs[(cp, name)] = model(**inputs)[0]
                    res[f"stats_cp{int(cp)}_{name}"] = dict(patch_info(model)["stats"])
                    if "sparse" in kw:
                        res[f"density_cp{int(cp)}"] = sparse_density(model)["overall"]
                    if on_variant is not None:
                        on_variant(cp, name, res)
    return res, outs


def _write(res, outs, model, variants, out_path) -> None:
    """Rank 0's differences (split vs one process vs stock per variant; sparse vs dense) and counters."""
    if "sparse" in variants:
        res["rel_l1_sparse_vs_dense"] = rel_l1(outs[(False, "sparse")], outs[(False, "dense")])
    for name in variants:
        record_errors(res, name, outs[(True, name)], outs[(False, name)], outs["exact"])
    res["nan"] = int(sum(o.isnan().sum() for o in outs.values()))
    res["layers"] = len(model.transformer_blocks)
    write_result(out_path, res)


def _sparse_variants(spec):
    return {"dense": {}, "sparse": {"sparse": spec}}


def hunyuan15_inputs(gen: torch.Generator, device="cpu", side: int = 16) -> dict:
    """`model_inputs("hunyuanvideo15")` in bf16 on ``device`` with a 2 x side x side latent (patch 1: 2·side²
    video tokens; 23 text tokens, 11 of them valid in sample 0)."""
    inputs = model_inputs("hunyuanvideo15", gen)
    inputs["hidden_states"] = torch.randn(2, 9, 2, side, side, generator=gen)
    return {k: (v.to(device, torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point()
                else v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def patched_hunyuan15_worker(rank, world, ulysses, ring, init_file, out_path, seed, cuda=False) -> None:
    """`sagegen.patch` on tiny HunyuanVideo-1.5 (bf16, 512 video tokens a sample), dense and block-sparse, in one
    process and under context parallelism (sagegen's plan): its key-mask processor, on the patch's backend
    route, hands each main-block call to the split with its (video, text) segments, so under Ulysses the
    sparse policy ranks the blocks in one process's order, text kept; rank 0 writes differences and counters."""
    from sagegen.models.tiny_classes import build_tiny_class
    from sagegen.patch import sparse_policy
    from sagegen.sparse.text import parse_sparse_arg

    backend, device, kernel = _setup(rank, world, init_file, cuda)
    try:
        inputs = hunyuan15_inputs(torch.Generator().manual_seed(seed), device)
        n_video = inputs["hidden_states"][0, 0].numel()
        text_ok = []
        stock_block_mask_for = sparse_policy.block_mask_for

        def checking_block_mask_for(session, q, k, attn_mask, scale, **kw):
            bs = stock_block_mask_for(session, q, k, attn_mask, scale, **kw)
            if bs is not None:
                text_ok.append(_text_kept(bs, k.shape[2], n_video))
            return bs
        sparse_policy.block_mask_for = checking_block_mask_for

        def text_kept(cp, name, res):
            if name == "sparse":
                res[f"text_kept_cp{int(cp)}"] = [bool(t) for t in text_ok]
            text_ok.clear()
        model = build_tiny_class("hunyuanvideo15", seed=seed % 1000, dtype=torch.bfloat16).to(device)
        variants = _sparse_variants(parse_sparse_arg("topk=0.5,steps=0,blocks=none,min_tokens=0"))
        res, outs = _patched_runs(model, inputs, ulysses, ring, backend, kernel, variants, text_kept)
        if rank == 0:
            _write(res, outs, model, variants, out_path)
    finally:
        _leave()
    _exit_cleanly()


def run_patched_hunyuan15(tmp_path: Path, ulysses: int, ring: int, seed: int, cuda: bool = False) -> dict:
    return spawn_ranks(patched_hunyuan15_worker, tmp_path, "patched_hunyuan15", ulysses, ring, seed, cuda)


def patched_ltx_worker(rank, world, ulysses, ring, init_file, out_path, seed, cuda=False) -> None:
    """`sagegen.patch(sparse=)` on tiny LTX-Video (bf16, 512 video tokens) in one process and under diffusers'
    own plan: its self-attention (the backend route) is video only, so a Ulysses split gathers its keys in one
    process's order and top-k runs there unchanged; rank 0 writes differences and counters."""
    from sagegen import SparseConfig
    from sagegen.models.tiny_classes import build_tiny_class

    backend, device, kernel = _setup(rank, world, init_file, cuda)
    try:
        model = build_tiny_class("ltx", seed=seed % 1000, dtype=torch.bfloat16).to(device)
        gen = torch.Generator().manual_seed(seed)
        inputs = dict(hidden_states=torch.randn(1, 2 * 16 * 16, model.config.in_channels, generator=gen).bfloat16(),
                      encoder_hidden_states=torch.randn(1, 12, 32, generator=gen).bfloat16(),
                      timestep=torch.full((1,), 500.0), encoder_attention_mask=torch.ones(1, 12, dtype=torch.long),
                      num_frames=2, height=16, width=16, rope_interpolation_scale=(8 / 25.0, 32, 32),
                      return_dict=False)
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        variants = _sparse_variants(SparseConfig(mode="topk", value=0.25, min_tokens=0, dense_steps=0.0,
                                                 dense_blocks=()))
        res, outs = _patched_runs(model, inputs, ulysses, ring, backend, kernel, variants)
        if rank == 0:
            _write(res, outs, model, variants, out_path)
    finally:
        _leave()
    _exit_cleanly()


def run_patched_ltx(tmp_path: Path, ulysses: int, ring: int, seed: int, cuda: bool = False) -> dict:
    return spawn_ranks(patched_ltx_worker, tmp_path, "patched_ltx", ulysses, ring, seed, cuda)


def patched_qwen_worker(rank, world, ulysses, ring, init_file, out_path, seed, cuda=False) -> None:
    """`sagegen.patch` on tiny Qwen-Image (bf16, 256 image + 8 text tokens, 3 of them padding) in one process
    and under diffusers' own plan: the fused joint prologue on each rank's tokens, its (text, image) segments
    handed to the split; rank 0 writes differences and counters."""
    from tests.support.dispatch_models import tiny_qwenimage
    from tests.support.patching import half_model_with_distinct_norms

    backend, device, kernel = _setup(rank, world, init_file, cuda)
    try:
        model, inputs = tiny_qwenimage(seed % 1000)
        gen = torch.Generator().manual_seed(seed)
        mask = torch.ones(1, 8, dtype=torch.long)
        mask[:, 5:] = 0  # at 2 ranks, rank 1's text chunk is part padding
        # 256 image tokens: the kernels' 64-key blocks see the split's token order
        inputs.update(hidden_states=torch.randn(1, 256, 16, generator=gen), img_shapes=[(1, 16, 16)],
                      encoder_hidden_states=torch.randn(1, 8, 16, generator=gen), encoder_hidden_states_mask=mask)
        model, inputs = half_model_with_distinct_norms(model, inputs, device, seed % 1000)
        variants = {"dense": {}}
        res, outs = _patched_runs(model, inputs, ulysses, ring, backend, kernel, variants)
        if rank == 0:
            _write(res, outs, model, variants, out_path)
    finally:
        _leave()
    _exit_cleanly()


def run_patched_qwen(tmp_path: Path, ulysses: int, ring: int, seed: int, cuda: bool = False) -> dict:
    return spawn_ranks(patched_qwen_worker, tmp_path, "patched_qwen", ulysses, ring, seed, cuda)
