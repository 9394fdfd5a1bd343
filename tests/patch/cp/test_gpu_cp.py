"""Context parallelism on 2+ GPUs (NCCL): sagegen's Triton kernels as the local attention, Ulysses and Ring,
with every mask case of tests/support/cp.py, at a length where the kernels' blocks matter (skipped with fewer
than 2 GPUs)."""

import pytest
import torch

from tests.support import cp_abort_launch
from tests.support import cp_patched as cp_patched_support
from tests.support import cp_route as cp_route_support
from tests.support import cp as cp_support
from tests.parallel.test_cp_attention import _check_ring, _check_ulysses
from tests.patch.cp.test_cp_models import (check_patched_flux, check_patched_hunyuan, check_patched_hunyuan15,
                                           check_patched_ltx, check_patched_qwen, check_patched_wan)

needs_2_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                  reason="needs 2 CUDA GPUs")


@pytest.mark.gpu
@needs_2_gpus
def test_a_rank_that_fails_mid_run_ends_a_cp_run_on_two_gpus(tmp_path):
    """Under NCCL, rank 0's failed sample write while rank 1 sits in the next sample's collectives: the launch
    must end with the error (the communicators aborted), not wait for rank 1 forever."""
    proc, seconds = cp_abort_launch.launch(tmp_path, cuda=True)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert cp_abort_launch.INJECTED in proc.stdout + proc.stderr
    assert seconds < 240


@pytest.mark.gpu
@needs_2_gpus
@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_cp_on_two_gpus(tmp_path, seed, ulysses, ring):
    res = cp_support.run_topology(tmp_path, ulysses=ulysses, ring=ring, seed=seed, s=4096, cuda=True)
    (_check_ulysses if ring == 1 else _check_ring)(res)


@pytest.mark.gpu
@needs_2_gpus
@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_wan_on_two_gpus(tmp_path, seed, ulysses, ring):
    """sagegen.patch under diffusers' CP on the GPUs: Wan's fused prologue kernel, sagegen's Hopper kernel as
    each rank's attention, FP8 linears through cuBLASLt (tiny Wan, 1,280 video tokens)."""
    check_patched_wan(cp_patched_support.run_patched_wan(tmp_path, ulysses=ulysses, ring=ring, seed=seed,
                                                         cuda=True), ring,
                      bitwise=False)


@pytest.mark.gpu
@needs_2_gpus
@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_hunyuanvideo_on_two_gpus(tmp_path, seed, ulysses, ring):
    """sagegen.patch on HunyuanVideo under CP on the GPUs: the fused joint prologue handed to the split, FP8
    linears with the fused cat-GELU projection, sparse with each rank's text kept (tiny model, 524 tokens a sample)."""
    check_patched_hunyuan(cp_patched_support.run_patched_hunyuan(tmp_path, ulysses=ulysses, ring=ring, seed=seed,
                                                                 cuda=True), ring, bitwise=False)


@pytest.mark.gpu
@needs_2_gpus
@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_hunyuanvideo15_sparse_on_two_gpus(tmp_path, seed, ulysses, ring):
    """sagegen.patch(sparse=) on HunyuanVideo-1.5 under CP on the GPUs: its key-mask calls with their segments,
    block-sparse on the Hopper kernel with each rank's text kept (tiny model, 535 tokens a sample)."""
    check_patched_hunyuan15(cp_route_support.run_patched_hunyuan15(tmp_path, ulysses=ulysses, ring=ring,
                                                                     seed=seed, cuda=True), ring, bitwise=False)


@pytest.mark.gpu
@needs_2_gpus
@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_ltx_sparse_on_two_gpus(tmp_path, seed, ulysses, ring):
    """sagegen.patch(sparse=) on LTX-Video under CP on the GPUs: the fused per-channel rotary prologue on each
    rank's rows of the tables, top-k on the Hopper kernel (tiny model, 512 video tokens); under Ring one call
    over the gathered keys per rank, its queries a window."""
    check_patched_ltx(cp_route_support.run_patched_ltx(tmp_path, ulysses=ulysses, ring=ring, seed=seed, cuda=True),
                      ring, bitwise=False)


@pytest.mark.gpu
@needs_2_gpus
@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_patched_qwenimage_and_flux_on_two_gpus(tmp_path, seed, ulysses, ring):
    """sagegen.patch on Qwen-Image and Flux under diffusers' plans on the GPUs: the fused joint prologues with
    their (text, image) segments (tiny models, 264 tokens)."""
    for name in ("qwen", "flux"):
        (tmp_path / name).mkdir()
    check_patched_qwen(cp_route_support.run_patched_qwen(tmp_path / "qwen", ulysses=ulysses, ring=ring, seed=seed,
                                                           cuda=True), ring, bitwise=False)
    check_patched_flux(cp_patched_support.run_patched_flux(tmp_path / "flux", ulysses=ulysses, ring=ring, seed=seed,
                                                           cuda=True), ring, bitwise=False)
