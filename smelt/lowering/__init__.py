"""ATen -> IR. Importing this package registers every lowering family."""
from . import (cat_pad, control_flow, division, extern_calls, factories, float_ops, foreach, indexing,  # noqa: F401
               movement, mutating_ops, padding, pointwise, pooling, random, reductions, scalars, scans, scatter, views)  # registration
from .graph import lower_graph

__all__ = ["lower_graph"]
