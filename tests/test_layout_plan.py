"""Channels-last through convolution nets (lowering/layout_plan.py): convolutions get NHWC operands,
the values between them stay NHWC, what the caller sees keeps eager's strides, and a training
step's saved activations reach the backward in the layout the forward chose."""
import logging
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import smelt.config
from smelt.lowering import layout_plan


@pytest.fixture(autouse=True)
def _no_tf32():
    # cuDNN's TF32 convolutions differ by 1e-3 between its NCHW and NHWC algorithms.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


class ResidualBlock(nn.Module):
    def __init__(self, c=8, classes=5):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.pool, self.fc = nn.MaxPool2d(2), nn.Linear(c, classes)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        z = self.pool(torch.relu(self.bn2(self.conv2(y)) + y))  # y: read by a convolution and the add
        return self.fc(z.mean((2, 3))), z


def _copies(names) -> list[str]:
    """Kernels that only copy (a layout conversion), not those a copy was fused into."""
    return [k for k in names if re.search(r"_fused_clone_\d+$", k)]


def _copies_weights(device) -> bool:
    """Whether the device's Target copies a parameter weight to NHWC in a kernel of smelt's
    (Target.copies_convolution_weights) rather than leaving it to the library call."""
    from smelt.pipeline import targets_for
    return targets_for(smelt.config.current())(torch.device(device).type).copies_convolution_weights


@pytest.mark.parametrize("setting", ["on", "off"])
def test_inference_matches_eager_in_value_and_strides(device, compile_fn, assert_close, observe, setting):
    torch.manual_seed(0)
    model = ResidualBlock().to(device).eval()
    x = torch.randn(2, 3, 16, 16, device=device)
    with torch.no_grad(), smelt.config.override(channels_last=setting):
        actual = compile_fn(model)(x)
    expected = model(x)
    for a, e in zip(actual, expected):
        assert_close(a, e, atol=1e-5, rtol=1e-5)
        assert a.stride() == e.stride()
    copies = _copies(k for g in observe.compiled_graphs() for k in g.kernel_names)
    if setting == "on":
        # The image is copied to NHWC, and the two weights where the Target copies them (elsewhere
        # the library converts them inside the convolution); the activation y is made NHWC by the
        # first convolution.
        assert len(copies) == (3 if _copies_weights(device) else 1), copies
        wrappers = "\n".join(g.wrapper_source for g in observe.compiled_graphs())
        assert re.search(r"\(2048, 1, 128, 8,?\)", wrappers)  # the convolutions' NHWC results
    else:
        assert copies == []


@pytest.mark.parametrize("backward_retraced", [True, False])
def test_training_step_matches_eager(device, compile_fn, assert_close, observe, monkeypatch, backward_retraced):
    """backward_retraced=False: as when an op's fake kernel refuses the saved values' new strides
    (the backward then reads them through copies in their traced layouts)."""
    if not backward_retraced:
        real = layout_plan.retrace
        monkeypatch.setattr(layout_plan, "retrace", lambda gm, since: bool(since.inserted(gm)) and real(gm, since))
    torch.manual_seed(0)
    model = ResidualBlock().to(device)
    x = torch.randn(2, 3, 16, 16, device=device)
    out, z = model(x)
    (out.sum() + z.sum()).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with smelt.config.override(channels_last="on"):
        out, z = compile_fn(model)(x)
        (out.sum() + z.sum()).backward()
    for name, p in model.named_parameters():
        assert_close(p.grad, expected[name], atol=1e-4, rtol=1e-4)  # NHWC convolutions sum in another order
        assert p.grad.stride() == expected[name].stride(), name
    backward = [g for g in observe.compiled_graphs() if g.kind == "backward"]
    assert backward
    # The saved activations arrive NHWC: the backward copies only the image to NHWC for the
    # convolutions' gradients (and the two weights, where the Target copies them), and the two
    # weight gradients back to eager's strides.
    if backward_retraced:
        copies = _copies(backward[-1].kernel_names)
        assert len(copies) == (5 if _copies_weights(device) else 3), copies


def test_symbolic_sizes_keep_traced_layouts(device, compile_fn, assert_close, caplog):
    torch.manual_seed(0)
    model = ResidualBlock().to(device).eval()
    compiled = compile_fn(model, dynamic=True)
    with torch.no_grad(), smelt.config.override(channels_last="on"), \
            caplog.at_level(logging.DEBUG, logger="smelt.lowering"):
        for size in (16, 20):
            x = torch.randn(2, 3, size, size, device=device)
            for a, e in zip(compiled(x), model(x)):
                assert_close(a, e, atol=1e-5, rtol=1e-5)
    assert "not planned for a graph with symbolic sizes" in caplog.text


@pytest.mark.parametrize("shape", [(2, -1), (2, 144)])  # the fake view raises RuntimeError / ValueError
def test_a_view_the_new_layout_cannot_express_reads_a_contiguous_copy(device, compile_fn, assert_close, shape,
                                                                      observe):
    torch.manual_seed(0)
    conv, fc = nn.Conv2d(3, 4, 3).to(device), nn.Linear(4 * 6 * 6, 3).to(device)

    def f(x):
        y = torch.relu(conv(x))
        return fc(y.view(*shape)), y  # flattening NHWC memory in NCHW order is no view

    x = torch.randn(2, 3, 8, 8, device=device)
    with torch.no_grad(), smelt.config.override(channels_last="on"):
        actual = compile_fn(f)(x)
    for a, e in zip(actual, f(x)):
        assert_close(a, e, atol=1e-5, rtol=1e-5)
        assert a.stride() == e.stride()
    (graph,) = observe.compiled_graphs()
    assert re.search(r"\(144, 1, 24, 4,?\)", graph.wrapper_source)  # planned: the convolution's result is NHWC


@pytest.mark.parametrize("read", ["returned", "read_by_a_kernel", "through_a_view", "of_the_convolution"])
def test_an_as_strided_read_of_a_planned_value_reads_eagers_storage(device, compile_fn, assert_close, read):
    # as_strided reads storage, not elements: over a convolution's result made NHWC it must read
    # what eager's NCHW memory holds (the class of fuzz seed 4303's padded product). The ATen call's
    # own NHWC result read NHWC memory (4.2 off eager); a kernel's is stored as traced.
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, bias=False).to(device)  # a bias would be added by a kernel, stored as traced

    def f(x):
        y = conv(x) if read == "of_the_convolution" else torch.relu(conv(x))
        if read == "through_a_view":
            y = y.view(2, 4, 36)
        z = y.as_strided((5, 7), (9, 2), 3)
        return z if read == "returned" else z * 2

    x = torch.randn(2, 3, 8, 8, device=device)
    with torch.no_grad(), smelt.config.override(channels_last="on"):
        actual = compile_fn(f)(x)
    assert_close(actual, f(x), atol=1e-5, rtol=1e-5)


class _SquareReadingStorage(torch.autograd.Function):
    """y * y whose backward reads the saved y through as_strided (its storage, in eager: NCHW order)."""

    @staticmethod
    def forward(ctx, y):
        ctx.save_for_backward(y)
        return y * y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * 2 * y.as_strided((y.numel(),), (1,), 0).view(y.shape)


def test_an_as_strided_read_of_a_saved_value_the_plan_made_nhwc(device, compile_fn, assert_close):
    # The backward's placeholder takes the forward's NHWC strides (restride_placeholders) before the
    # re-trace: the storage rule must judge it by the strides it was traced with, not its new ones
    # (a review found the gradients off by 490).
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, device=device, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device=device, requires_grad=True)

    def f(x, w):
        return _SquareReadingStorage.apply(F.conv2d(x, w)).sum()

    expected = torch.autograd.grad(f(x, w), (x, w))
    with smelt.config.override(channels_last="on"):
        actual = torch.autograd.grad(compile_fn(f)(x, w), (x, w))
    for a, e in zip(actual, expected):
        assert_close(a, e, atol=1e-4, rtol=1e-4)


def test_pointwise_kernels_walk_a_channels_last_buffer_in_memory_order(device, compile_fn, assert_close, observe):
    """x is channels-last, so eager's x * 2 + 1 is too: one flat walk, no transposing tiles."""
    x = torch.randn(2, 8, 5, 7, device=device).contiguous(memory_format=torch.channels_last)
    actual = compile_fn(lambda x: x * 2 + 1)(x)
    assert_close(actual, x * 2 + 1)
    assert actual.stride() == (x * 2 + 1).stride()
    (graph,) = observe.compiled_graphs()
    (source,) = graph.kernel_sources.values()
    assert "# tiled:" not in source, source


def test_setting_is_checked():
    with pytest.raises(smelt.config.SettingError, match="SMELT_CHANNELS_LAST"):
        with smelt.config.override(channels_last="sometimes"):
            pass


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convolution_bias_is_added_by_the_kernel_after_it(device, compile_fn, assert_close, observe, dtype):
    """Where cuDNN would add a convolution's bias in a pass of its own (Target.adds_convolution_bias),
    the convolution runs without it and the add fuses into the next kernel, rounded as ATen's."""
    from smelt.codegen import backends
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1).to(device=device, dtype=dtype)

    def f(x):
        return torch.nn.functional.gelu(conv(x))

    x = torch.randn(2, 4, 9, 9, device=device, dtype=dtype)
    with torch.no_grad():
        assert_close(compile_fn(f)(x), f(x))
    target = backends.for_device(smelt.config.current(), torch.device(device)).target(torch.device(device).type)
    (graph,) = observe.compiled_graphs()
    calls = [line for line in graph.wrapper_source.splitlines() if "torch.convolution(" in line]
    assert len(calls) == 1
    assert (", None, [1, 1]" in calls[0]) == target.adds_convolution_bias, calls[0]


def test_reductions_of_a_channels_last_value_in_every_direction(device, check):
    """A channels-last pointwise value read by reductions over C (rows of C in memory), over H*W
    (strided) and over all but C: each lines up with the value's memory-order walk or falls back
    to reading it from memory, never reads another element."""
    x = torch.randn(2, 8, 5, 6, device=device).contiguous(memory_format=torch.channels_last)

    def f(x):
        y = torch.relu(x) * 2
        return y, y.sum(1), y.mean((2, 3)), (y * y).sum((0, 2, 3))

    actual, expected = check(f, x)
    for a, e in zip(actual, expected):
        assert a.stride() == e.stride()


def test_a_weight_the_graph_computes_is_written_channels_last_by_its_producer(device, compile_fn, assert_close,
                                                                             observe):
    """A graph-input weight goes to ATen as it is (ATen converts it inside the convolution) unless the
    Target copies it; a weight the graph computes (here a scaled copy, as an AMP cast) is written
    NHWC by the kernel computing it: no kernel of its own."""
    torch.manual_seed(0)
    w1, w2 = torch.randn(6, 4, 3, 3, device=device), torch.randn(6, 6, 3, 3, device=device)

    def f(x):
        y = torch.relu(torch.nn.functional.conv2d(x, w1, padding=1))
        return torch.nn.functional.conv2d(y, w2 * 0.5, padding=1)

    x = torch.randn(2, 4, 9, 9, device=device)
    with torch.no_grad(), smelt.config.override(channels_last="on"):
        actual = compile_fn(f)(x)
    expected = f(x)
    assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    assert actual.stride() == expected.stride()
    (graph,) = observe.compiled_graphs()
    # The image, the result to NCHW (and w1, where the Target copies weights).
    assert len(_copies(graph.kernel_names)) == (3 if _copies_weights(device) else 2), graph.kernel_names
    assert "(54, 1, 18, 6)" in graph.wrapper_source  # w2 * 0.5, written NHWC


def test_a_convolution_with_bias_that_onednn_crashes_on_in_channels_last(device, check):
    """torch 2.13's oneDNN convolution dies by signal 11 on this channels-last input given a bias
    (eager too; CPU fuzz seed 1941): on the CPU the bias is added by the kernel after it."""
    torch.manual_seed(0)
    x, w, b = torch.randn(1, 6, 2, 1, device=device), torch.randn(4, 3, 1, 1, device=device), torch.randn(4, device=device)
    with smelt.config.override(channels_last="on"):
        check(lambda x, w, b: torch.nn.functional.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2), x, w, b,
              atol=1e-5, rtol=1e-5)


def test_a_strided_weight_kept_nchw_for_onednn_is_copied_with_its_value(device, check):
    """CPU fuzz seed 2204, program 101: a strided bfloat16 weight needing a gradient, under a
    convolution kept in NCHW; its contiguous copy reached lowering with no traced value (no other
    layout change, so the plan traced nothing again)."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, 1, 1, device=device, dtype=torch.bfloat16)
    w = torch.randn(3, 2, 1, 1, device=device, dtype=torch.bfloat16).transpose(0, 1).requires_grad_()
    check(lambda x, w: torch.nn.functional.conv2d(x, w, None, stride=2, padding=1, dilation=2, groups=2), x, w,
          atol=1e-2, rtol=1e-2)


ONEDNN_CRASH = """
import torch, torch.nn as nn, smelt
torch.manual_seed(0)
# A convolution makes NHWC memory, then one that oneDNN's channels-last bfloat16 kernel dies on
# (signal 11 in eager too, given a channels-last input): smelt keeps its operands in NCHW.
net = nn.Sequential(nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1, stride=2, padding=1, dilation=2)).to(torch.bfloat16)
x = torch.randn(1, 2, 2, 1, dtype=torch.bfloat16, requires_grad=True)
out = torch.compile(net, backend="smelt")(x)
out.float().square().sum().backward()
with torch.no_grad():
    expected = net(x)
torch.testing.assert_close(out, expected)
print("ran", tuple(out.shape))
"""


def test_strided_dilated_bfloat16_convolutions_stay_nchw_on_the_cpu(device):
    """CPU fuzz seed 1970, program 398: oneDNN crashed where smelt had made the input channels-last."""
    if device != "cpu":
        pytest.skip("oneDNN's bug: the CPU only")
    result = subprocess.run([sys.executable, "-c", ONEDNN_CRASH], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ran (1, 2, 2, 2)" in result.stdout, (result.returncode, result.stderr[-2000:])


class PatchAttention(nn.Module):
    """ViT's first block in miniature: a patch convolution (so a layout is planned), then q, k and v
    as views of one projection's output, which SDPA saves for its backward."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.patch, self.qkv, self.heads = nn.Conv2d(3, dim, 4, stride=4), nn.Linear(dim, 3 * dim), heads

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        b, n, d = tokens.shape
        q, k, v = self.qkv(tokens).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)


def test_views_saved_as_traced_are_not_copied(device, compile_fn, assert_close):
    """q, k and v are saved as the views of the projection they were traced as: a dense copy of
    each (for strides the plan changed) made the forward copy them at its end, beside the
    projection (ViT's AMP training peak 1.02x Inductor's)."""
    from smelt.tools.saved import saved_for_backward
    torch.manual_seed(0)
    model = PatchAttention().to(device)
    x = torch.randn(2, 3, 16, 16, device=device)
    model(x).square().sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with smelt.config.override(channels_last="on"):
        loss = compile_fn(model)(x).square().sum()
    views = [t for t in saved_for_backward(loss) if t.dim() == 4 and t.shape[-1] == 8 and not t.is_contiguous()]
    loss.backward()
    for name, p in model.named_parameters():
        assert_close(p.grad, expected[name], atol=1e-4, rtol=1e-4)
    storages = {t.untyped_storage().data_ptr() for t in views}
    assert len(views) >= 3 and len(storages) < len(views), [(t.shape, t.stride()) for t in views]


def _layouts(gm) -> dict:
    """Each value's layout, but for the copies that give the caller eager's strides: their values
    are set by the plan (`_restore_visible_outputs`), not traced."""
    (output,) = gm.graph.find_nodes(op="output")
    restored = {n for n in output.all_input_nodes if n.target is torch.ops.aten.clone.default and not n.kwargs}
    return {n.name: (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype) for n in gm.graph.nodes
            for v in [n.meta.get("val")] if isinstance(v, torch.Tensor) and n not in restored}


class _PaddedHead(nn.Module):
    def __init__(self, vocab=37, dim=16):
        super().__init__()
        self.emb, self.up, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, dim), nn.Linear(dim, vocab)

    def forward(self, tokens):
        logits = self.head(F.gelu(self.up(self.emb(tokens))))
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


@pytest.mark.parametrize("program", ["channels_last_training", "padded_head_training"])
def test_a_retrace_gives_every_value_the_layout_a_whole_retrace_gives(device, monkeypatch, program):
    """fx_retrace.retrace traces again only the values a change can reach; a whole trace of the same
    graph afterwards must find nothing else to change (forward and backward plans both)."""
    from smelt.lowering import fx_retrace, matmul_padding
    checked = []
    real = layout_plan.retrace

    def retrace_then_check(gm, since):
        ok = real(gm, since)
        if ok:
            partial = _layouts(gm)
            whole = fx_retrace.Checkpoint(gm)
            whole.changed = lambda gm: set(gm.graph.nodes)
            assert real(gm, whole)
            checked.append({k: (v, _layouts(gm)[k]) for k, v in partial.items() if _layouts(gm)[k] != v})
        return ok
    monkeypatch.setattr(layout_plan, "retrace", retrace_then_check)
    torch.manual_seed(0)
    if program == "channels_last_training":
        model, x, setting = ResidualBlock().to(device), torch.randn(2, 3, 16, 16, device=device), {"channels_last": "on"}
        loss = lambda m: sum(t.sum() for t in m(x))  # noqa: E731
    else:
        monkeypatch.setattr(matmul_padding, "MIN_MACS", 0)
        monkeypatch.setattr(matmul_padding, "MIN_MATRIX_MACS", 0)
        model, tokens, setting = _PaddedHead().to(device), torch.randint(0, 37, (2, 5), device=device), {"matmul_padding": "on"}
        loss = lambda m: m(tokens)  # noqa: E731
    torch._dynamo.reset()
    with smelt.config.override(**setting):
        loss(torch.compile(model, backend="smelt")).backward()
    assert checked, "no layout was planned"
    assert all(not d for d in checked), checked
