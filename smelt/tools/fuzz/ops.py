"""The op families programs are drawn from. Each family adds one op to a Builder (or returns False when
nothing it could read fits); the Builder keeps it only if eager runs it."""
from __future__ import annotations

import torch

from .builder import FLOATS, Builder


def _is_float(t):
    return t.is_floating_point()


def _nd(k):
    return lambda t: t.dim() >= k


def _dim(b: Builder, t):
    return b.r.randrange(t.dim()) if t.dim() else 0


def _dims(b: Builder, t):
    """A random dim tuple: one dim, several, or all."""
    n = t.dim()
    k = b.r.choice((1, 1, 2, n)) if n else 0
    return tuple(sorted(b.r.sample(range(n), min(k, n))))


def _shape_str(shape):
    return repr(tuple(shape))


def unary(b: Builder) -> bool:
    a = b.operand()
    t = b.t(a)
    if t.is_floating_point():
        forms = ["torch.exp({a})", "torch.tanh({a})", "torch.sigmoid({a})", "F.relu({a})", "F.gelu({a})",
                 "F.silu({a})", "torch.sin({a})", "torch.log1p({a}.abs())", "torch.sqrt({a}.abs())",
                 "torch.rsqrt({a}.abs() + 0.5)", "{a}.pow(3)", "torch.clamp({a}, -0.5, 0.5)", "torch.erf({a})",
                 "torch.reciprocal({a}.abs() + 1)", "-{a}", "{a}.abs()", "F.softplus({a})",
                 "F.leaky_relu({a}, 0.1)", "F.hardtanh({a})", "torch.log({a}.abs() + 1e-3)", "F.elu({a})"]
        if b.stable(a):
            forms += ["torch.floor({a})", "torch.round({a})", "torch.sign({a})", "({a} * 4).trunc()",
                      "{a}.to(torch.int32)", "{a}.to(torch.int64)", "{a}.to(torch.bool)", "torch.isfinite({a})"]
    elif t.dtype == torch.bool:
        forms = ["~{a}", "torch.logical_not({a})", "{a}.to(torch.float32)", "{a}.to(torch.int64)"]
    else:
        forms = ["-{a}", "{a}.abs()", "{a} * {a}", "~{a}", "torch.clamp({a}, -3, 4)", "{a}.pow(2)",
                 "{a}.to(torch.float32)", "{a}.to(torch.bfloat16)", "{a}.to(torch.uint8)", "{a}.to(torch.int8)",
                 "torch.sign({a})"]
    form = b.r.choice(forms)
    if b.r.random() < 0.15:
        form = f"({form}).to({b.r.choice(FLOATS)})"
    return b.emit("unary", "{out} = " + form, exact=not t.is_floating_point(), a=a)


def _partner(b: Builder, a, fresh_p=0.4):
    """A name whose shape broadcasts with a's (often a new input)."""
    shape = tuple(b.t(a).shape)

    def fits(t):
        try:
            torch.broadcast_shapes(shape, t.shape)
            return True
        except RuntimeError:
            return False
    if b.r.random() > fresh_p:
        found = b.pick(fits)
        if found:
            return found
    variant = tuple(1 if b.r.random() < 0.25 else s for s in shape)
    if variant and b.r.random() < 0.2:
        variant = variant[b.r.randrange(len(variant)):]
    return b.new_input(variant)


def binary(b: Builder) -> bool:
    a = b.operand()
    c = _partner(b, a)
    ta, tc = b.t(a), b.t(c)
    floats = ta.is_floating_point() or tc.is_floating_point()
    forms = ["{a} + {c}", "torch.add({a}, {c}, alpha=2)", "{a} - {c}", "{a} * {c}", "torch.maximum({a}, {c})",
             "torch.minimum({a}, {c})", "{a} / ({c}.abs() + 1)", "torch.where({a} > 0, {a}, {c})"]
    if floats:
        forms += ["torch.atan2({a}, {c})", "torch.lerp({a}, {c}, 0.3)", "torch.addcmul({a}, {a}, {c}, value=0.5)",
                  "torch.hypot({a}, {c})", "torch.copysign({a}, {c})", "{a} * torch.sigmoid({c})"]
    else:
        forms += ["{a} & {c}", "{a} | {c}", "{a} ^ {c}", "torch.remainder({a}, {c}.abs() + 1)",
                  "torch.div({a}, {c}.abs() + 1, rounding_mode='floor')", "torch.fmod({a}, {c}.abs() + 1)",
                  "torch.div({a}, {c}.abs() + 1, rounding_mode='trunc')"]
    if b.stable(a) and b.stable(c):
        forms += ["{a} > {c}", "{a} == {c}", "{a} <= {c}", "torch.logical_and({a}, {c})",
                  "torch.logical_xor({a} > 0, {c})", "torch.where({a} > {c}, {a}, {c})"]
    return b.emit("binary", "{out} = " + b.r.choice(forms), exact=not floats, a=a, c=c)


def scalar(b: Builder) -> bool:
    a = b.operand()
    forms = ["{a} + 2", "{a} * 1.5", "3 - {a}", "{a} / 4", "{a} * -3", "{a}.clamp(min=0)", "torch.pow({a}, 2)",
             "torch.where({a} > 0, {a}, 0.0)", "{a} + 0.5", "{a}.add(1, alpha=2)", "2.5 * {a} - 1",
             "torch.full_like({a}, 3) + {a}", "{a} * True", "{a}.mul(2).sub(1)", "torch.rsub({a}, 1)"]
    if b.stable(a):
        forms += ["{a} > 0", "{a} != 1", "torch.div({a}, 3, rounding_mode='floor')", "torch.remainder({a}, 3)",
                  "{a} // 2", "torch.where({a} < 1, 1, {a})"]
    return b.emit("scalar", "{out} = " + b.r.choice(forms), exact=not b.t(a).is_floating_point(), a=a)


def reduction(b: Builder) -> bool:
    a = b.operand(_nd(1))
    if a is None:
        return False
    t = b.t(a)
    dims, d = _dims(b, t), _dim(b, t)
    keep = b.r.random() < 0.4
    kd = f", keepdim={keep}"
    forms = [f"{{a}}.sum({dims}{kd})", f"{{a}}.sum()", f"{{a}}.prod({d}{kd})", f"{{a}}.any({d}{kd})",
             f"{{a}}.all({d}{kd})", f"{{a}}.sum({dims}, dtype=torch.float64)"]
    if b.stable(a) or not t.requires_grad:
        # Their gradients pick positions: over half floats eager rounded differently (index_put's
        # accumulation rounds per duplicate on the CPU, once on CUDA and in smelt), ties differ (seed 3206).
        forms += [f"{{a}}.amax({dims}{kd})", f"{{a}}.amin({d}{kd})", f"torch.max({{a}}, {d}{kd}).values"]
    if t.is_floating_point():
        forms += [f"{{a}}.mean({dims}{kd})", f"{{a}}.var({dims}, correction={b.r.choice((0, 1))}{kd})",
                  f"{{a}}.std({d}{kd})", f"torch.logsumexp({{a}}, {dims}{kd})",
                  f"torch.linalg.vector_norm({{a}}, dim={dims}{kd})", f"torch.var_mean({{a}}, {d})[1]",
                  "{a}.mean()", "{a}.var()", f"{{a}}.sum({d}, dtype=torch.float16)"]
    else:
        forms += [f"{{a}}.float().mean({dims}{kd})", f"{{a}}.sum({d}, dtype=torch.int32)"]
    if b.stable(a):
        forms += [f"{{a}}.argmax({d}{kd})", f"{{a}}.argmin({d}{kd})", "{a}.argmax()",
                  f"torch.min({{a}}, {d}{kd}).indices", f"({{a}} > 0).sum({dims})"]
    return b.emit("reduction", "{out} = " + b.r.choice(forms), exact=not t.is_floating_point(), a=a)


def view(b: Builder) -> bool:
    a = b.operand()
    t = b.t(a)
    n = t.dim()
    r = b.r
    forms = ["{a}.unsqueeze(%d)" % r.randint(-n - 1, n), "{a}[None]", "{a}.reshape(-1)", "{a}.flatten()"]
    if n >= 1:
        perm = list(range(n))
        r.shuffle(perm)
        d = r.randrange(n)
        size = t.shape[d]
        start = r.randint(0, max(size - 1, 0))
        step = r.choice((1, 2, 3))
        idx = ", ".join([":"] * d + [f"{start}::{step}"])
        forms += [f"{{a}}.permute({perm})", f"{{a}}[{idx}]", f"{{a}}.narrow({d}, {start}, {max(size - start - 1, 0)})",
                  f"{{a}}.movedim({d}, 0)", f"{{a}}.select({d}, {r.randint(-size, size - 1) if size else 0})",
                  f"{{a}}.squeeze()", f"{{a}}[..., {r.randint(0, 1)}:]", "{a}.reshape(%s)" % _reshape(b, t)]
        ones = [k for k in range(n) if t.shape[k] == 1]
        if ones:
            shape = list(t.shape)
            shape[r.choice(ones)] = r.choice((2, 3))
            forms += [f"{{a}}.expand({_shape_str(shape)})"]
        forms += [f"{{a}}.unsqueeze(0).expand(2, {', '.join(['-1'] * n)})"]
    if n >= 2:
        i, j = r.sample(range(n), 2)
        forms += [f"{{a}}.transpose({i}, {j})", f"{{a}}.diagonal(0, {i}, {j})", "{a}.mT",
                  f"{{a}}.diagonal({r.choice((-1, 1))}, {i}, {j})"]
    if n == 2:
        forms += ["{a}.t()"]
    numel = t.numel()
    if numel >= 2:  # strides that never overlap: an overlapping as_strided's backward differs in torch.compile
        if r.random() < 0.5:
            size, stride = (r.randint(1, numel // 2),), (r.randint(1, 2),)
        else:
            rows = r.randint(1, max(1, numel // 3))
            size, stride = (rows, 2), (r.randint(2, max(2, (numel - 2) // max(rows - 1, 1))), 1)
        forms += [f"{{a}}.clone(memory_format=torch.contiguous_format).as_strided({size}, {stride}, {r.randint(0, 1)})"]
    return b.emit("view", "{out} = " + r.choice(forms), exact=a in b.exact, a=a)


def _reshape(b, t):
    """A reshape of t to another shape of the same numel."""
    sizes = list(t.shape)
    numel = t.numel()
    if numel == 0:
        return "0, -1" if sizes else "-1"
    f = b.r.choice([k for k in range(1, numel + 1) if numel % k == 0])
    return f"{f}, {numel // f}" if b.r.random() < 0.7 else f"-1, {f}"


def _slice_of(b: Builder, t):
    """A basic-indexing slice of t (source text) and the shape it views."""
    view = torch.empty(t.shape, device="meta")
    parts = []
    for size in t.shape:
        choice = b.r.random()
        if choice < 0.4:
            parts.append(":")
        elif choice < 0.7:
            parts.append(f"{b.r.randint(0, max(size - 1, 0))}:")
        else:
            parts.append(f"::{b.r.choice((2, 3))}")
    text = f"[{', '.join(parts)}]" if parts else "[...]"
    return text, tuple(eval(f"view{text}", {"view": view}).shape)


def inplace(b: Builder) -> bool:
    a = b.operand()
    t = b.t(a)
    sl, shape = _slice_of(b, t)
    value = b.r.choice(("2", "0.5", "{c}", "{c}"))
    c = None
    if "{c}" in value and b.r.random() < 0.6:
        # A value the program has (another input it may write too, or `a` itself): each write must
        # read what eager's program order gives it, whatever order the compiled writes run in.
        c = b.pick(lambda v: tuple(v.shape) == tuple(shape) and v.dtype == t.dtype)
    if "{c}" in value and c is None:
        c = b.new_input(tuple(1 if b.r.random() < 0.3 else s for s in shape))
    method = b.r.choice(("add_", "mul_", "copy_", "sub_", "clamp_", "fill_", "zero_", "masked_fill_"))
    if method == "clamp_":
        call = "clamp_(min=-0.5)"
    elif method == "zero_":
        call = "zero_()"
    elif method == "fill_":
        call = "fill_(1.25)"
    elif method == "masked_fill_":
        call = "masked_fill_({c} > 0, -1)" if c else "masked_fill_(torch.ones((), dtype=torch.bool), 3)"
    elif method == "copy_" and c is None:
        call = "copy_(torch.ones(()))"
    else:
        call = f"{method}({value})"
    target = b.r.random()
    names = {"a": a, "c": c} if c else {"a": a}
    if target < 0.5:  # a fresh copy, then a view of it written
        src = "{out} = {a}.clone()\n{out}%s.%s" % (sl, call)
    elif target < 0.75 and t.dim() == 2:
        src = "{out} = {a}.clone()\n{out}.t().%s" % call
    elif any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape)):
        return False  # writing an expanded value in place: elements alias each other
    else:  # the value itself, through a view (an input: a mutated input)
        src = "{a}%s.%s\n{out} = {a}.clone()" % (sl, call)
    return b.emit("inplace", src, **names)


def indexing(b: Builder) -> bool:
    a = b.operand(_nd(1))
    if a is None:
        return False
    t = b.t(a)
    r = b.r
    d = _dim(b, t)
    high = t.shape[d]
    k = r.choice((1, 2, 3, 5))
    choice = r.randrange(7)
    if choice == 0:
        return b.emit("indexing", "{out} = torch.index_select({a}, %d, {i})" % d, exact=a in b.exact, a=a,
                      i=b.index((k,), high))
    if choice == 1:
        shape = list(t.shape)
        shape[d] = k
        shape = [s if j == d else r.randint(min(1, s), s) for j, s in enumerate(shape)]
        return b.emit("indexing", "{out} = torch.gather({a}, %d, {i})" % d, exact=a in b.exact, a=a,
                      i=b.index(tuple(shape), high))
    if choice == 2:
        return b.emit("indexing", "{out} = {a}[{i}]", exact=a in b.exact, a=a,
                      i=b.index(r.choice(((k,), (2, k))), t.shape[0]))
    if choice == 3 and t.dim() >= 2:
        return b.emit("indexing", "{out} = {a}[:, {i}, ...]", exact=a in b.exact, a=a, i=b.index((k,), t.shape[1]))
    if choice == 4 and t.dim() >= 2:
        return b.emit("indexing", "{out} = {a}[{i}, {j}]", exact=a in b.exact, a=a,
                      i=b.index((k,), t.shape[0]), j=b.index((1,), t.shape[1]))
    m = b.new_input(tuple(1 if r.random() < 0.3 else s for s in t.shape), torch.bool)
    if choice == 5:
        return b.emit("indexing", "{out} = {a}.masked_fill({m}, %s)" % r.choice(("0", "-1.5", "True")),
                      exact=a in b.exact, a=a, m=m)
    c = _partner(b, a)
    return b.emit("indexing", "{out} = torch.where({m}, {a}, {c})", exact=a in b.exact and c in b.exact,
                  a=a, m=m, c=c)


def scatter(b: Builder) -> bool:
    a = b.operand(_nd(1))
    if a is None:
        return False
    t = b.t(a)
    r = b.r
    n = t.dim()
    shape = [r.randint(min(1, s), s) for s in t.shape]
    d = _dim(b, t)
    src = b.new_input(tuple(shape), t.dtype)
    choice = r.randrange(7)
    if choice == 0:  # distinct indices along the last dim: a plain scatter is deterministic
        return b.emit("scatter", "{out} = {a}.scatter(%d, {i}, {s})" % (n - 1), a=a, s=src,
                      i=b.index(tuple(shape), t.shape[-1], unique=True))
    if choice == 1:
        return b.emit("scatter", "{out} = {a}.scatter(%d, {i}, 2.0)" % (n - 1), a=a,
                      i=b.index(tuple(shape), t.shape[-1], unique=True))
    if choice == 2:
        return b.emit("scatter", "{out} = {a}.scatter_add(%d, {i}, {s})" % d, a=a, s=src,
                      i=b.index(tuple(shape), t.shape[d]))
    if choice == 3:
        how = r.choice(("sum", "prod", "amax", "amin", "mean"))
        return b.emit("scatter", "{out} = {a}.scatter_reduce(%d, {i}, {s}, %r, include_self=%s)"
                      % (d, how, r.random() < 0.5), a=a, s=src, i=b.index(tuple(shape), t.shape[d]))
    k = r.choice((1, 2, 4))
    vals = b.new_input((k, *t.shape[1:]) if r.random() < 0.7 else (1,), t.dtype)
    if choice == 4:
        return b.emit("scatter", "{out} = {a}.index_put(({i},), {s}, accumulate=True)", a=a, s=vals,
                      i=b.index((k,), t.shape[0]))
    if choice == 5:
        return b.emit("scatter", "{out} = {a}.clone()\n{out}.index_put_(({i},), {s})", a=a, s=vals,
                      i=b.index((k,), t.shape[0], unique=True))
    vals = b.new_input((*t.shape[:d], k, *t.shape[d + 1:]), t.dtype)
    return b.emit("scatter", "{out} = {a}.index_add(%d, {i}, {s}, alpha=2)" % d, a=a, s=vals,
                  i=b.index((k,), t.shape[d]))


def cat(b: Builder) -> bool:
    a = b.operand()
    t = b.t(a)
    r = b.r
    if t.dim() == 0:
        return b.emit("cat", "{out} = torch.stack([{a}, {a} * 2])", a=a)
    d = _dim(b, t)
    if r.random() < 0.15:  # one piece: a new tensor equal to its input (seed 2802: it was the input itself)
        form = r.choice(["{out} = torch.cat([{a}], %d)" % d, "{out} = torch.stack([{a}], %d).squeeze(%d)" % (d, d)])
        return b.emit("cat", form, exact=a in b.exact, a=a)
    same = b.pick(lambda u: u.shape == t.shape and u is not t)
    if r.random() < 0.5 or same is None:
        shape = list(t.shape)
        shape[d] = r.choice((0, 1, 2, 3))
        other = b.new_input(tuple(shape), r.choice((t.dtype, b.random_dtype())))
        forms = ["{out} = torch.cat([{a}, {c}], %d)" % d, "{out} = torch.cat([{c}, {a}, {c}], %d)" % d]
    else:
        other = same
        forms = ["{out} = torch.stack([{a}, {c}], %d)" % r.randint(0, t.dim()), "{out} = torch.cat([{a}, {c}], %d)" % d]
    return b.emit("cat", r.choice(forms), exact=a in b.exact and other in b.exact, a=a, c=other)


def matmul(b: Builder) -> bool:
    a = b.operand(lambda u: u.is_floating_point() and u.dim() >= 1,
                  shape=tuple(b.r.choice((1, 2, 3, 5)) for _ in range(b.r.randint(1, 3))), dtype=b.float_dtype)
    if a is None:
        return False
    t = b.t(a)
    r = b.r
    k, n = t.shape[-1], r.choice((1, 2, 3, 4, 8))
    choice = r.randrange(5)
    if choice == 0:
        return b.emit("matmul", "{out} = {a} @ {w}", a=a, w=b.new_input((k, n), t.dtype))
    if choice == 1:
        bias = b.new_input((n,), t.dtype) if r.random() < 0.6 else None
        return b.emit("matmul", "{out} = F.linear({a}, {w}%s)" % (", {bias}" if bias else ""), a=a,
                      w=b.new_input((n, k), t.dtype), **({"bias": bias} if bias else {}))
    if choice == 2 and t.dim() == 3:
        return b.emit("matmul", "{out} = torch.bmm({a}, {w})", a=a, w=b.new_input((t.shape[0], k, n), t.dtype))
    if choice == 3 and t.dim() == 2:
        return b.emit("matmul", "{out} = torch.addmm({bias}, {a}, {w}, beta=0.5)", a=a,
                      w=b.new_input((k, n), t.dtype), bias=b.new_input((n,), t.dtype))
    return b.emit("matmul", "{out} = torch.matmul({w}, {a}.unsqueeze(-1)).squeeze(-1)", a=a,
                  w=b.new_input((n, k), t.dtype))


def conv(b: Builder) -> bool:
    r = b.r
    two = r.random() < 0.5
    depthwise = r.random() < 0.35  # one input channel per group, windows to 5x5: mobile nets' (smelt's own kernels)
    if depthwise:
        groups = cin = r.randint(1, 8)
        cout = cin * r.choice((1, 1, 1, 2))
    else:
        groups = r.choice((1, 1, 2))
        cin, cout = groups * r.randint(1, 3), groups * r.randint(1, 2)
    spatial = tuple(r.randint(1, 7) for _ in range(2 if two else 1))
    dtype = b.float_dtype
    x = b.pick(lambda u: u.is_floating_point() and u.dim() == len(spatial) + 2 and u.shape[1] == cin)
    if x is None:
        x = b.new_input((r.randint(1, 2), cin, *spatial), dtype)
    ks = tuple(r.randint(1, 5 if depthwise else 3) for _ in spatial)
    # Real nets' 1x1 convolutions (stride 1, no padding, one group: the products smelt runs as cuBLAS
    # calls or as reductions), rare among the random draws otherwise.
    pointwise = not depthwise and groups == 1 and r.random() < 0.3
    if pointwise:
        ks = (1,) * len(spatial)
    w = b.new_input((cout, cin // groups, *ks), b.t(x).dtype)
    bias = b.new_input((cout,), b.t(x).dtype) if r.random() < 0.5 else None
    padding = r.choice((0, 1, 2)) if depthwise else r.choice((0, 1))
    stride, dilation = r.choice((1, 2)), r.choice((1, 1, 2))
    if pointwise:
        stride, padding, dilation = 1, 0, 1
    args = f"stride={stride}, padding={padding}, dilation={dilation}, groups={groups}"
    fn = "F.conv2d" if two else "F.conv1d"
    return b.emit("conv", "{out} = %s({x}, {w}, %s, %s)" % (fn, "{bias}" if bias else "None", args),
                  x=x, w=w, **({"bias": bias} if bias else {}))


def norm(b: Builder) -> bool:
    r = b.r
    a = b.operand(lambda u: u.is_floating_point() and u.dim() >= 2, dtype=b.float_dtype,
                  shape=(r.randint(1, 4), r.choice((2, 4, 6)), *([r.randint(1, 5)] * r.randint(0, 2))))
    if a is None:
        return False
    t = b.t(a)
    choice = r.randrange(6)
    if choice == 0:
        k = r.randint(1, t.dim())
        shape = tuple(t.shape[-k:])
        affine = r.random() < 0.7
        names = {"w": b.new_input(shape, t.dtype), "bias": b.new_input(shape, t.dtype)} if affine else {}
        return b.emit("norm", "{out} = F.layer_norm({a}, %r%s)" % (shape, ", {w}, {bias}" if affine else ""),
                      a=a, **names)
    c = t.shape[1]
    if choice == 1:
        g = r.choice([k for k in range(1, c + 1) if c % k == 0] or [1])
        if t.numel() == 0:  # eager's CUDA backward gives nan weight gradients over no elements, its CPU one 0
            return False
        # eager's CPU group_norm backward of a channels-last input segfaults (torch 2.13): given a dense copy
        dense = ".contiguous()" if t.dim() == 4 and not t.is_contiguous() else ""
        return b.emit("norm", "{out} = F.group_norm({a}%s, %d, {w}, {bias})" % (dense, g), a=a,
                      w=b.new_input((c,), t.dtype), bias=b.new_input((c,), t.dtype))
    if choice in (2, 3):
        training = choice == 3
        mean = b.new_input((c,), t.dtype, layout="contiguous", grad=False)  # written in training
        var = b.new_input((c,), t.dtype, kind="positive", layout="contiguous", grad=False)
        # eager's CPU batch_norm backward misreads a weight that is not contiguous (torch 2.13: a stride-0
        # weight reads past it, a stride-2 one gives grad_input from the wrong elements), so weights are
        # contiguous. The layout is still drawn, so that a seed gives the programs it gave before.
        b.r.choice(("contiguous", "strided"))
        return b.emit("norm", "{out} = F.batch_norm({a}, {m}, {v}, {w}, {bias}, training=%s, momentum=0.2)" % training,
                      a=a, m=mean, v=var, w=b.new_input((c,), t.dtype, layout="contiguous"),
                      bias=b.new_input((c,), t.dtype, layout="contiguous"))
    if choice == 4:
        return b.emit("norm", "{out} = {a} * torch.rsqrt({a}.pow(2).mean(-1, keepdim=True) + 1e-6) * {w}", a=a,
                      w=b.new_input((t.shape[-1],), t.dtype))
    return b.emit("norm", "{out} = F.normalize({a}, dim=%d)" % _dim(b, t), a=a)


def softmax(b: Builder) -> bool:
    a = b.operand(lambda u: u.is_floating_point() and u.dim() >= 1, dtype=b.float_dtype)
    if a is None:
        return False
    d = _dim(b, b.t(a))
    form = b.r.choice(("torch.softmax({a}, %d)", "F.log_softmax({a}, %d)", "torch.softmax({a}, %d, dtype=torch.float32)",
                       "F.softmin({a}, %d)"))
    return b.emit("softmax", "{out} = " + form % d, a=a)


def scan(b: Builder) -> bool:
    a = b.operand(_nd(1))
    if a is None:
        return False
    t = b.t(a)
    d = _dim(b, t)
    forms = ["torch.cumsum({a}, %d)", "torch.cumsum({a}, %d, dtype=torch.float64)", "torch.cumprod({a}.clamp(-2, 2), %d)",
             "torch.cummax({a}, %d).values"]
    if t.is_floating_point():
        forms += ["torch.logcumsumexp({a}, %d)"]
    if b.stable(a):
        forms += ["torch.cummin({a}, %d).indices"]
    return b.emit("scan", "{out} = " + b.r.choice(forms) % d, exact=not t.is_floating_point(), a=a)


def attention(b: Builder) -> bool:
    r = b.r
    dtype = b.float_dtype
    batch, hkv = r.choice((1, 2)), r.choice((1, 2))
    heads = hkv * r.choice((1, 2))
    L, S, E = r.randint(1, 6), r.randint(1, 6), r.choice((2, 4, 8))
    q = b.new_input((batch, heads, L, E), dtype)
    k = b.new_input((batch, hkv, S, E), dtype)
    v = b.new_input((batch, hkv, S, r.choice((E, 3))), dtype)
    causal = r.random() < 0.3
    mask = None
    if not causal and r.random() < 0.5:
        mask = b.new_input((L, S), torch.bool if r.random() < 0.5 else dtype, grad=False)
    gqa = heads != hkv
    kv = ("{k}", "{v}")
    extra = ""
    if gqa and r.random() < 0.5:
        kv = tuple(f"{n}.repeat_interleave({heads // hkv}, dim=1)" for n in kv)
    elif gqa:
        extra = ", enable_gqa=True"
    scale = ", scale=0.3" if r.random() < 0.3 else ""
    names = {"q": q, "k": k, "v": v, **({"m": mask} if mask else {})}
    return b.emit("attention", "{out} = F.scaled_dot_product_attention({q}, %s, %s, attn_mask=%s, is_causal=%s%s%s)"
                  % (kv[0], kv[1], "{m}" if mask else "None", causal, scale, extra), **names)


def movement(b: Builder) -> bool:
    a = b.operand(_nd(1))
    if a is None:
        return False
    t = b.t(a)
    d = _dim(b, t)
    r = b.r
    forms = ["torch.flip({a}, [%d])" % d, "torch.roll({a}, %d, %d)" % (r.randint(-3, 3), d),
             "F.pad({a}, (%d, %d))" % (r.randint(0, 2), r.randint(-1, 2)), "{a}.repeat(%s)" % ", ".join(
                 str(r.choice((1, 2))) for _ in range(t.dim())), "torch.sort({a}, %d).values" % d]
    if t.dim() >= 2:
        forms += ["torch.tril({a})", "torch.triu({a}, 1)"]
    if t.is_floating_point() and t.dim() == 4:
        forms += ["F.avg_pool2d({a}, 2, ceil_mode=True)", "F.max_pool2d({a}, 2, 1, 1)",
                  "F.interpolate({a}, scale_factor=2, mode='nearest')"]
    return b.emit("movement", "{out} = " + r.choice(forms), exact=a in b.exact, a=a)


def vision(b: Builder) -> bool:
    """The resampling, pooling and padding of convolution nets and their heads (segmentation decoders,
    detection necks), on a 4-D float tensor; a form eager rejects for these sizes is dropped."""
    r = b.r
    a = b.operand(lambda u: u.is_floating_point() and u.dim() == 4, dtype=b.float_dtype,
                  shape=(r.randint(1, 3), r.choice((1, 3, 4, 8)), r.randint(2, 9), r.randint(2, 9)))
    if a is None:
        return False
    h, w = b.t(a).shape[2:]
    size = (r.randint(1, 2 * h + 1), r.randint(1, 2 * w + 1))
    pooled = (r.randint(1, max(h, 1)), r.randint(1, max(w, 1)))
    pads = tuple(r.randint(0, 2) for _ in range(4))
    corners = r.random() < 0.5
    forms = [f"F.interpolate({{a}}, size={size}, mode='bilinear', align_corners={corners})",
             f"F.interpolate({{a}}, size={size}, mode='bicubic', align_corners={corners})",
             f"F.interpolate({{a}}, size={size}, mode='nearest-exact')",
             f"F.interpolate({{a}}, scale_factor={r.choice((0.5, 1.5, 2.0))}, mode='nearest')",
             f"F.adaptive_avg_pool2d({{a}}, {pooled})", f"F.adaptive_max_pool2d({{a}}, {pooled})",
             "F.avg_pool2d({a}, 3, 2, 1, count_include_pad=False)",
             f"F.avg_pool2d({{a}}, 2, divisor_override={r.randint(1, 5)})",
             f"F.max_pool2d({{a}}, 3, {r.randint(1, 2)}, 1, dilation={r.randint(1, 2)}, ceil_mode={corners})",
             f"F.pad({{a}}, {pads}, mode='{r.choice(('reflect', 'replicate', 'circular'))}')",
             "F.pixel_shuffle({a}, 2)", "F.pixel_unshuffle({a}, 2)",
             f"F.unfold({{a}}, 2, padding={r.randint(0, 1)}, stride={r.randint(1, 2)})",
             "F.hardswish({a}) * F.hardsigmoid({a})", "F.mish({a})"]
    form = r.choice(forms)
    moves_only = form.startswith(("F.pixel_", "F.pad("))  # exact values in, exact values out
    return b.emit("vision", "{out} = " + form, exact=a in b.exact and moves_only, a=a)


def loss(b: Builder) -> bool:
    """Training losses over logits (rows of classes) or scores, as their mean: cross entropy with label
    smoothing and an ignored class, weighted NLL, BCE with logits, smooth L1, KL divergence."""
    r = b.r
    a = b.operand(lambda u: u.is_floating_point() and u.dim() == 2 and u.shape[0] > 0 and u.shape[1] > 0,
                  dtype=b.float_dtype, shape=(r.randint(1, 6), r.randint(2, 7)))
    if a is None:
        return False
    n, c = b.t(a).shape
    choice = r.randrange(5)
    if choice in (0, 1):
        target = b.index((n,), c)
        if choice == 0:
            return b.emit("loss", "{out} = F.cross_entropy({a}, {t}, label_smoothing=%.2f, ignore_index=%d)"
                          % (r.choice((0.0, 0.1, 0.3)), r.randrange(c)), a=a, t=target)
        weight = b.new_input((c,), b.t(a).dtype, kind="positive", grad=False)
        return b.emit("loss", "{out} = F.nll_loss(F.log_softmax({a}, -1), {t}, weight={w})", a=a, t=target, w=weight)
    other = b.new_input((n, c), b.t(a).dtype, grad=choice != 2)
    if choice == 2:
        return b.emit("loss", "{out} = F.binary_cross_entropy_with_logits({a}, torch.sigmoid({o}))", a=a, o=other)
    if choice == 3:
        return b.emit("loss", "{out} = F.smooth_l1_loss({a}, {o}, beta=%.1f)" % r.choice((0.5, 1.0)), a=a, o=other)
    return b.emit("loss", "{out} = F.kl_div(F.log_softmax({a}, -1), F.softmax({o}, -1), reduction='batchmean')",
                  a=a, o=other)


FAMILIES = {
    "unary": (unary, 3), "binary": (binary, 4), "scalar": (scalar, 2), "reduction": (reduction, 3),
    "view": (view, 3), "inplace": (inplace, 2), "indexing": (indexing, 2), "scatter": (scatter, 2),
    "cat": (cat, 1.5), "matmul": (matmul, 1), "conv": (conv, 0.7), "norm": (norm, 1.2), "softmax": (softmax, 1),
    "scan": (scan, 1), "attention": (attention, 0.5), "movement": (movement, 1), "vision": (vision, 0.7),
    "loss": (loss, 0.5),
}
