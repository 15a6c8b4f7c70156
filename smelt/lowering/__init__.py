"""ATen -> IR. Importing this package registers every lowering family."""
from . import cat_pad, extern_calls, factories, indexing, pointwise, reductions, views  # noqa: F401  (registration)
from . import float_ops, movement, padding, pooling  # noqa: F401  (registration)
from .graph import IRGraph, OutputSpec, lower_graph

__all__ = ["IRGraph", "OutputSpec", "lower_graph"]
