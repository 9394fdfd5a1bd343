"""Block-sparse attention policy: predicted (training-free) and static block masks, for `sagegen.sageattn`'s
``sparse=`` and `sagegen.patch(pipe, sparse=...)`. The block-sparse kernels are in `sagegen.kernels`.

Names load lazily: `sagegen.sparse.sparse_config` / `.text` need no torch (the CLI parses --sparse with them);
`sagegen.sparse.op` registers the ``sagegen::sparse_blocks`` custom op when first imported.
"""

from __future__ import annotations

import importlib

_LAZY = {"SparseConfig": "sagegen.sparse.sparse_config", "parse_spec": "sagegen.sparse.sparse_config",
         "sparse_block_mask": "sagegen.sparse.op"}
__all__ = list(_LAZY)


def __getattr__(name: str):
    source = _LAZY.get(name)
    if source is None:
        raise AttributeError(f"module 'sagegen.sparse' has no attribute {name!r}")
    value = getattr(importlib.import_module(source, __name__), name)
    globals()[name] = value
    return value
