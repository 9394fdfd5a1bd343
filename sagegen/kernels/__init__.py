"""Attention implementations: `reference` (PyTorch emulation, the oracle), `triton_*` (the kernels).

Nothing here knows about diffusers.
"""
