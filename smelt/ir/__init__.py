"""The loop-level IR: nodes, loop nests, views, extern calls, and the ops vocabulary."""
from .extern import ExternKernel, MultiOutput
from .loops import Loops, Pointwise, Reduction
from .nodes import (Buffer, ComputedBuffer, ConstantBuffer, FixedLayout, FlexibleLayout, InputBuffer, IRNode,
                    Layout, SharedStorage, StorageBox, TensorBox, make_contiguous_layout)
from .ops import ops, use_handler
from .scatter import Scatter
from .scan import SCAN_COMBINES, Scan, ScanCombine
from .views import ReinterpretView, View, as_strided_layout

__all__ = ["Buffer", "ComputedBuffer", "ConstantBuffer", "ExternKernel", "FixedLayout", "FlexibleLayout", "IRNode",
           "InputBuffer", "Layout", "Loops", "MultiOutput", "Pointwise", "Reduction",
           "ReinterpretView", "SCAN_COMBINES", "Scan", "ScanCombine", "Scatter", "SharedStorage", "StorageBox", "TensorBox", "View",
           "as_strided_layout", "make_contiguous_layout", "ops", "use_handler"]
