"""The state of a program under construction: its inputs, its ops, and an example value of every name,
computed eagerly as each op is added, so an op eager rejects is never kept."""
from __future__ import annotations

import random
import warnings

import torch

from .inputs import LAYOUTS, make_input
from .program import Input, Op, Program

FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INTS = (torch.int32, torch.int64, torch.int8, torch.uint8)
ALL_DTYPES = FLOATS + INTS + (torch.bool,)


class Builder:
    def __init__(self, rng: random.Random, device="cpu", backward=True):
        self.r = rng
        self.device = device
        self.backward = backward
        self.inputs: list[Input] = []
        self.ops: list[Op] = []
        self.env: dict[str, torch.Tensor] = {}
        self.exact: set[str] = set()  # names whose values are computed without rounding (see stable)
        self.float_dtype = rng.choices(FLOATS, weights=(5, 1, 2, 2))[0]
        self.int_dtype = rng.choice(INTS)
        rank = rng.choice((1, 2, 2, 3, 3, 4))
        self.base_shape = [rng.choice((1, 2, 3, 4, 5, 6, 8)) for _ in range(rank)]
        if rng.random() < 0.08:
            self.base_shape[rng.randrange(rank)] = 0
        self.rejected = 0

    # -- names ------------------------------------------------------------------------------------
    def t(self, name) -> torch.Tensor:
        return self.env[name]

    def names(self, pred=None) -> list:
        return [n for n in self.env if pred is None or pred(self.env[n])]

    def pick(self, pred=None):
        found = self.names(pred)
        return self.r.choice(found) if found else None

    def stable(self, name) -> bool:
        """Whether a discontinuous op (a comparison, argmax, floor, a cast to int) may read `name`:
        eager rounds half-precision values after every op and smelt once per fused chain, so such ops
        read only exact values, integers and float32/float64."""
        t = self.env[name]
        return name in self.exact or not t.is_floating_point() or t.dtype in (torch.float32, torch.float64)

    # -- inputs -----------------------------------------------------------------------------------
    def random_dtype(self):
        kind = self.r.random()
        if kind < 0.6:
            return self.float_dtype
        if kind < 0.75:
            return self.r.choice(FLOATS)
        if kind < 0.92:
            return self.int_dtype
        return torch.bool

    def variant_of_base(self):
        """The base shape with some dims set to 1 or leading dims dropped (broadcasts against it)."""
        shape = [1 if self.r.random() < 0.2 else s for s in self.base_shape]
        if len(shape) > 1 and self.r.random() < 0.2:
            shape = shape[self.r.randrange(1, len(shape)):]
        return tuple(shape)

    def new_input(self, shape=None, dtype=None, kind="value", high=0, layout=None, grad=None) -> str:
        if shape is None and dtype is None and kind == "value" and self.r.random() < 0.1:
            shape, dtype, kind = (), self.r.choice((torch.float32, torch.float64)), "host"  # a CPU scalar
        shape = tuple(self.variant_of_base() if shape is None else shape)
        dtype = self.random_dtype() if dtype is None else dtype
        if layout is None:
            layout = "contiguous"
            if kind == "value" and self.r.random() < 0.4:
                options = [lay for lay in LAYOUTS[1:] if (lay != "channels_last" or len(shape) == 4)
                           and (lay != "transposed" or len(shape) >= 2) and len(shape) >= 1]
                layout = self.r.choice(options) if options else "contiguous"
        if grad is None:
            grad = (self.backward and dtype.is_floating_point and kind in ("value", "positive", "host")
                    and self.r.random() < 0.6)
        name = f"x{len(self.inputs)}"
        spec = Input(name, shape, dtype, layout, bool(grad), self.r.randrange(2 ** 31), kind, high)
        self.inputs.append(spec)
        self.env[name] = make_input(shape, dtype, layout, spec.grad, spec.seed, kind, high, self.device)
        self.exact.add(name)
        return name

    def index(self, shape, high, unique=False) -> str | None:
        if high == 0 and 0 not in shape:  # no index is in range; ATen's CPU kernels let some through, CUDA asserts
            return None
        return self.new_input(shape, torch.int64, "unique" if unique else "index", high, "contiguous", False)

    def operand(self, pred=None, fresh_p=0.3, **fresh):
        """An existing name satisfying pred, or a new input."""
        name = None if self.r.random() < fresh_p else self.pick(pred)
        if name is None:
            name = self.new_input(**fresh)
            if pred is not None and not pred(self.env[name]):
                return None
        return name

    # -- ops --------------------------------------------------------------------------------------
    def emit(self, family: str, source: str, exact=False, **names) -> bool:
        """Add the op `source` (lines; {out} the new name, other {fields} from names) if eager runs it."""
        if any(v is None for v in names.values()):
            return False
        out = f"v{len(self.ops)}"
        lines = source.format(out=out, **names).split("\n")
        scope = {"torch": torch, "F": torch.nn.functional, **self.env}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec("\n".join(lines), scope)
            value = scope[out]
            if not isinstance(value, torch.Tensor):
                raise TypeError("not a tensor")
        except Exception:
            self.rejected += 1
            return False
        self.env[out] = value
        if exact:
            self.exact.add(out)
        self.ops.append(Op(out, lines, family))
        return True

    def program(self, extra_outputs=0.3) -> Program:
        used = {n for op in self.ops for n in op.uses()}
        outputs = [op.out for op in self.ops if op.out not in used or self.r.random() < extra_outputs]
        inputs = [i for i in self.inputs if i.name in used or i.name in outputs]
        return Program(inputs, list(self.ops), outputs, self.backward)
