"""Control flow the wrapper runs: `torch.cond` as a choice between two compiled subgraphs."""
from __future__ import annotations

from .nodes import Buffer


class Conditional(Buffer):
    """`name = (true_branch if predicate else false_branch)(operands)`.

    Each branch is a whole graph compiled by smelt on its own, called with the operands and
    returning a tuple; MultiOutput nodes pick the tensors out of it. `predicate` is a realized
    bool tensor of one element or a sympy condition on sizes.
    """

    def __init__(self, name: str, predicate, true_branch: str, false_branch: str, operands: list,
                 origins: frozenset):
        super().__init__(name, None)
        self.predicate = predicate
        self.true_branch = true_branch
        self.false_branch = false_branch
        self.operands = list(operands)
        self.origins = origins

    def inputs(self) -> list:
        found = [o for o in self.operands if hasattr(o, "get_size") and hasattr(o, "name")]
        if hasattr(self.predicate, "name"):
            found.insert(0, self.predicate)
        return found

    def describe(self) -> str:
        names = ", ".join(getattr(o, "name", str(o)) for o in self.operands)
        return f"{self.name}: {self.true_branch} if {getattr(self.predicate, 'name', self.predicate)} " \
               f"else {self.false_branch} ({names})"
