"""The lattice grids of the IQ1 / IQ2 / IQ3 block types, for the native core.

Each of these types stores groups of 8 weights (4 for IQ3's) as an index into a
fixed table of level vectors, part of the GGUF format.  The gguf package carries
the tables (for its own dequantizers); here they are read from it and handed to
the core as bytes, in the order of pe.h's PE_IQ_GRID_* ids.  A grid the gguf
package lacks leaves its types unsupported: such a model fails at load naming
the type, like any other type without kernels.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pyengine.errors import NativeError

# (PE_IQ_GRID_* id, gguf.quants class name, numpy dtype of the levels)
GRIDS = ((0, "IQ2_XXS", np.uint8), (1, "IQ2_XS", np.uint8), (2, "IQ2_S", np.uint8),
         (3, "IQ3_XXS", np.uint8), (4, "IQ3_S", np.uint8), (5, "IQ1_S", np.int8))


def levels(class_name: str, dtype) -> np.ndarray | None:
    """The grid of gguf.quants.<class_name> as a flat array of `dtype`, or None."""
    try:
        from gguf import quants
        cls = getattr(quants, class_name)
        cls.init_grid()
        grid = np.asarray(cls.grid, dtype=np.float32).reshape(-1)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    values = grid.astype(dtype)
    return values if np.array_equal(values.astype(np.float32), grid) else None


def install(set_grid: Callable[[int, memoryview], None]) -> None:
    """Give the core every grid the gguf package has (see the module docstring)."""
    for grid_id, class_name, dtype in GRIDS:
        values = levels(class_name, dtype)
        if values is not None:
            try:
                set_grid(grid_id, memoryview(values.view(np.uint8)))
            except NativeError:   # a grid of another size: its types stay unsupported
                continue
