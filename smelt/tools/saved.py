"""What a compiled training forward saved for its backward: the tensors held by the compiled autograd
functions (AOTAutograd's, whatever the backend) behind a loss. For tests and probes of what the
partitioner chose to save (issue 22's training peaks)."""
from __future__ import annotations

import torch


def saved_for_backward(loss: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor the compiled functions reachable from `loss`'s autograd graph saved."""
    saved, stack, seen = [], [loss.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if "CompiledFunction" in type(fn).__name__:
            saved += list(fn.saved_tensors)
        stack += [f for f, _ in fn.next_functions]
    return saved
