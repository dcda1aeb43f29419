"""Graph building over the native core: Backend, Context, Tensor, and nn layers."""

from pyengine.ml.context import Backend, Context, Tensor

__all__ = ["Backend", "Context", "Tensor"]
