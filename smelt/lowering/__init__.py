"""ATen -> IR. Importing this package registers every lowering family."""
from . import (cat_pad, control_flow, extern_calls, factories, indexing, pointwise, random, reductions,  # noqa: F401
               scalars, scans, scatter, views)  # registration
from .graph import IRGraph, OutputSpec, lower_graph

__all__ = ["IRGraph", "OutputSpec", "lower_graph"]
