"""The reference backend: what the pipeline asks of it (codegen/backends.py). Its kernels are
Python objects (kernel.py), held by the GeneratedKernel, not source: a graph that has one is not
written to the graph cache, and its runtime `load` hands the object to the wrapper."""
from __future__ import annotations

from ...artifact import GeneratedKernel
from ...errors import KernelCompileError
from ...target import CPU, Target
from ..backends import GraphContext, KernelUnsupported
from .kernel import ReferenceKernel
from .survey import survey


class ReferenceBackend:
    name = "reference"
    devices = frozenset({"cpu"})  # nothing in it is CPU-only, but it has been run on no GPU yet
    def interprets(self, device_type: str) -> bool:
        return False

    def target(self, device_type: str) -> Target:
        return CPU  # the oracle lowers the graph as the CPU's compiling backend does

    def finishes_reductions(self, step, ctx: GraphContext) -> bool:
        return False

    def launch_key(self, step, ctx: GraphContext):
        return None

    def alike(self, step, ctx: GraphContext) -> bool:
        return False

    def generate(self, step, ctx: GraphContext, index: int) -> ReferenceKernel:
        if step.combo or step.finishers:
            raise KernelUnsupported("smelt: the reference backend runs kernels one at a time")
        plan = step.plan
        kept = dict(plan.kept_in_input)
        inputs, sizes = survey(plan, kept)
        origins = sorted({o for n in plan.nodes for o in n.buffer.origins})
        name = kernel_name(plan, origins, index)
        # Its "source" is what it runs, for logs and SMELT_DEBUG_DIR: comments, so still a Python file.
        lines = [f"reference kernel {name}: torch ops on whole tensors, no generated code",
                 f"aten ops: {', '.join(origins)}",
                 f"iterates {plan.xnumel} x {plan.rnumel}; stores: {', '.join(plan.stored) or '-'}"]
        lines += [f"{n.buffer.describe()}  [{plan.placement[n.name]}]" for n in plan.nodes]
        source = "".join(f"# {line}\n" for text in lines for line in text.splitlines())
        return ReferenceKernel(name, plan, inputs, sizes, kept, origins, source)

    def record(self, kernel, step, ctx: GraphContext, index: int) -> GeneratedKernel:
        return GeneratedKernel(name=kernel.name, source=kernel.source, origins=tuple(kernel.origins), config=None,
                               candidates=(), workspace=None, xnumel_arg=len(kernel.params) + len(kernel.size_args),
                               interpret=False, backend=self.name, program=kernel)


def kernel_name(plan, origins: list[str], index: int) -> str:
    kind = "scan" if plan.has_scan else ("red" if plan.is_reduction else "poi")
    ops = sorted({o.split(".")[1].strip("_") for o in origins if "." in o} - {""})[:5]
    return f"reference_{kind}_fused_{'_'.join(ops) or 'copy'}_{index}"


def load(kernel: GeneratedKernel, path: str, cache_dir: str, keep_kernels: bool) -> ReferenceKernel:
    if kernel.program is None:
        raise KernelCompileError(f"smelt: reference kernel {kernel.name} has no object to run (it is never cached)")
    return kernel.program


BACKEND = ReferenceBackend()
