"""Block-sparse attention policy: predicted (training-free) and static block masks, for `sagegen.sageattn`'s
``sparse=`` and `sagegen.patch(pipe, sparse=...)`. The block-sparse kernels are in `sagegen.kernels`."""

from . import op as _op  # noqa: F401  (registers the sagegen::sparse_blocks custom op)
from .config import SparseConfig, parse_spec
from .op import sparse_block_mask

__all__ = ["SparseConfig", "parse_spec", "sparse_block_mask"]
