"""A generated program: inputs, a straight line of ops over named values, and the values it returns.
It prints as a Python script that reproduces itself (`Program.source()`)."""
from __future__ import annotations

import dataclasses
import hashlib
import linecache
import re

import torch

NAME = re.compile(r"\b[xv]\d+\b")  # inputs are x<k>, op results v<k>; nothing else in op source matches


@dataclasses.dataclass
class Input:
    name: str
    shape: tuple
    dtype: torch.dtype
    layout: str = "contiguous"
    grad: bool = False
    seed: int = 0
    kind: str = "value"  # value | index | unique | positive | host (see inputs.make_input)
    high: int = 0
    group: int = 0  # which sub-program of a batch it belongs to

    def call(self, device="cpu") -> str:
        extra = "" if self.kind == "value" else f", kind={self.kind!r}, high={self.high}"
        dev = "" if device == "cpu" else f", device={device!r}"
        return (f"make_input({tuple(self.shape)!r}, {self.dtype}, {self.layout!r}, grad={self.grad}, "
                f"seed={self.seed}{extra}{dev})")


@dataclasses.dataclass
class Op:
    out: str
    lines: list  # Python source lines, defining `out` from earlier names
    family: str
    group: int = 0

    def uses(self) -> set:
        return {n for line in self.lines for n in NAME.findall(line)} - {self.out}


@dataclasses.dataclass
class Program:
    inputs: list
    ops: list
    outputs: list
    backward: bool = True

    def groups(self) -> list:
        return sorted({i.group for i in self.inputs} | {o.group for o in self.ops})

    def body(self, fn_name="fn") -> str:
        lines = [f"def {fn_name}({', '.join(i.name for i in self.inputs)}):"]
        lines += ["    " + line for op in self.ops for line in op.lines]
        lines.append(f"    return ({''.join(o + ', ' for o in self.outputs)})")
        return "\n".join(lines)

    def source(self, device="cpu", backend_note="") -> str:
        """A standalone script: the program, its inputs, and the check by smelt's accuracy rule."""
        inputs = "\n".join(f"    {i.call(device)},  # {i.name}" for i in self.inputs)
        note = f"# {backend_note}\n" if backend_note else ""
        return (f"{note}import torch\nimport torch.nn.functional as F\nimport smelt\n"
                f"from smelt.tools.fuzz.inputs import make_input\nfrom smelt.tools.fuzz.runner import check_fn\n\n"
                f"{self.body()}\n\n\ninputs = [\n{inputs}\n]\n"
                f"print(check_fn(fn, inputs, backward={self.backward}) or 'passes')\n")

    def narrowest_cast(self):
        """The narrowest float dtype the program computes in: a cast or dtype= argument its source
        names, or an input's (a float16 sum promoted to a float32 result carries float16's rounding),
        or None."""
        body = self.body()
        named = {i.dtype for i in self.inputs}
        for name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)):
            if dtype in named or f"torch.{name}" in body or (name == "float32" and ".float()" in body):
                return dtype
        return None

    def function(self, reference=False):
        """The program as a Python function. reference: every float dtype it names is float64 (with float64
        inputs, the float64 run the accuracy rule measures against)."""
        body = self.body()
        if reference:
            body = re.sub(r"torch\.(float32|bfloat16|float16)\b", "torch.float64", body).replace(".float()", ".double()")
        scope = {"torch": torch, "F": torch.nn.functional}
        # A file name linecache knows: torch's precompile (--precompile) reads the function's source.
        filename = f"<fuzz program {hashlib.sha256(body.encode()).hexdigest()[:12]}>"
        linecache.cache[filename] = (len(body), None, body.splitlines(True), filename)
        exec(compile(body, filename, "exec"), scope)
        return scope["fn"]

    def sub_program(self, group: int) -> "Program":
        ops = [o for o in self.ops if o.group == group]
        defined = {o.out for o in ops}
        return Program([i for i in self.inputs if i.group == group], ops,
                       [o for o in self.outputs if o in defined or any(i.name == o for i in self.inputs
                                                                          if i.group == group)],
                       self.backward)


def renamed(program: Program, start_x: int, start_v: int, group: int) -> Program:
    """The same program with inputs numbered from x<start_x>, values from v<start_v>, all in `group`."""
    mapping = {}
    for k, i in enumerate(program.inputs):
        mapping[i.name] = f"x{start_x + k}"
    for k, o in enumerate(program.ops):
        mapping[o.out] = f"v{start_v + k}"

    def sub(text):
        return NAME.sub(lambda m: mapping.get(m.group(), m.group()), text)

    return Program([dataclasses.replace(i, name=mapping[i.name], group=group) for i in program.inputs],
                   [Op(mapping[o.out], [sub(line) for line in o.lines], o.family, group) for o in program.ops],
                   [mapping[o] for o in program.outputs], program.backward)


def merged(programs: list) -> Program:
    """Independent programs as one (a batch: one compile); each keeps its group number."""
    inputs, ops, outputs = [], [], []
    for g, p in enumerate(programs):
        r = renamed(p, len(inputs), len(ops), g)
        inputs += r.inputs
        ops += r.ops
        outputs += r.outputs
    return Program(inputs, ops, outputs, all(p.backward for p in programs))
