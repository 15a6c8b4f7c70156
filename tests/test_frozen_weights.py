"""SMELT_FREEZE_WEIGHTS: what an inference graph computes from weights alone runs once, in a prologue,
and again only when a weight moves or changes (lowering/frozen_weights.py)."""
import pytest
import torch
import torch.nn as nn

import smelt

pytestmark = pytest.mark.smelt_only


def _net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
    net[1].running_mean.uniform_(-1, 1)
    net[1].running_var.uniform_(0.5, 2)
    return net


def _frozen(fn, observe, **settings):
    torch._dynamo.reset()
    observe.reset()
    return torch.compile(fn, backend="smelt", options={"freeze_weights": True, **settings})


def _folded(observe):
    return [g.folded_weights for g in observe.compiled_graphs() if g.folded_weights is not None]


def test_convolution_weights_are_copied_to_channels_last_once(observe):
    net, x = _net(), torch.randn(2, 3, 10, 10)
    compiled = _frozen(net, observe, channels_last="on")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), net(x), atol=1e-4, rtol=1e-4)
    (folded,) = _folded(observe)
    assert folded.runs == 1
    assert len(folded.names) == 2 and all("clone" in name for name in folded.names)  # the two 3x3 weights
    graph = observe.compiled_graphs()[-1]
    assert graph.wrapper_source.count("folded_") >= 2


def test_a_weight_changed_in_place_or_replaced_is_folded_again(observe):
    net, x = _net(), torch.randn(2, 3, 10, 10)
    compiled = _frozen(net, observe, channels_last="on")
    with torch.no_grad():
        compiled(x)
        net[0].weight.mul_(2)  # an in-place change: the version counter moves
        torch.testing.assert_close(compiled(x), net(x), atol=1e-4, rtol=1e-4)
        net.load_state_dict(_net().state_dict())  # copied in place too
        torch.testing.assert_close(compiled(x), net(x), atol=1e-4, rtol=1e-4)
        net[3].weight = nn.Parameter(torch.randn_like(net[3].weight))  # another tensor: another storage
        torch.testing.assert_close(compiled(x), net(x), atol=1e-4, rtol=1e-4)
    assert _folded(observe)[-1].runs >= 3


def test_an_autocast_weight_cast_runs_once(observe):
    torch.manual_seed(0)
    lin, x = nn.Linear(16, 8), torch.randn(4, 16)
    compiled = _frozen(lin, observe)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = lin(x)
        for _ in range(2):
            out = compiled(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    (folded,) = _folded(observe)
    assert folded.runs == 1 and len(folded.names) == 2  # the weight's and the bias's casts


def test_a_returned_copy_of_a_weight_stays_in_the_graph(observe):
    torch.manual_seed(0)
    lin, x = nn.Linear(4, 4), torch.randn(2, 4)

    def fn(x):
        return lin(x), lin.weight.clone(), lin.weight.t().contiguous()
    compiled = _frozen(fn, observe)
    with torch.no_grad():
        out, w, wt = compiled(x)
        w.zero_()  # the caller owns what it gets: writing into it changes nothing the next call reads
        wt.zero_()
        out2, w2, wt2 = compiled(x)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(w2, lin.weight)
    torch.testing.assert_close(wt2, lin.weight.t())


def test_a_buffer_the_graph_updates_is_not_frozen(observe):
    # A batch norm in training mode updates its running statistics in place, under no_grad too.
    net, x = _net().train(), torch.randn(2, 3, 10, 10)
    reference = _net().train()
    compiled = _frozen(net, observe, channels_last="on")
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), reference(x), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(net[1].running_mean, reference[1].running_mean)
    torch.testing.assert_close(net[1].running_var, reference[1].running_var)


def test_training_is_untouched(observe):
    net, x = _net(), torch.randn(2, 3, 10, 10)
    reference = _net()
    reference(x).sum().backward()
    compiled = _frozen(net, observe, channels_last="on")
    compiled(x).sum().backward()
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    assert not _folded(observe)


def test_off_by_default(observe):
    net, x = _net(), torch.randn(2, 3, 10, 10)
    torch._dynamo.reset()
    observe.reset()
    with torch.no_grad(), smelt.config.override(channels_last="on"):
        torch.compile(net, backend="smelt")(x)
    assert not _folded(observe)




def test_an_autocast_convolution_weight_is_cast_and_made_channels_last_once(observe, assert_close):
    torch.manual_seed(0)
    conv, x = nn.Conv2d(3, 4, 3), torch.randn(2, 3, 8, 8)
    compiled = _frozen(conv, observe, channels_last="on")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            assert_close(compiled(x), conv(x))  # bfloat16: to 1e-2
    (folded,) = _folded(observe)
    assert folded.runs == 1 and any("clone" in name for name in folded.names), folded.names
    graph = observe.compiled_graphs()[-1]
    weight = [line for line in graph.wrapper_source.splitlines() if "convolution(" in line]
    assert weight and "folded_clone" in weight[0], weight


def test_symbolic_sizes_and_a_shared_weight(observe, assert_close):
    # Sizes that vary: the layout plan leaves such graphs as traced, so no channels-last weight copy is
    # made (an NCHW input would then be converted in every convolution); a cast still moves. One weight
    # read by two layers is one input.
    torch.manual_seed(0)
    conv, lin = nn.Conv2d(3, 4, 3), nn.Linear(6, 6)

    def fn(x, y):
        return conv(x).sum((2, 3)), lin(lin(y))
    compiled = _frozen(fn, observe, channels_last="on")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for n in (5, 7, 9):
            x, y = torch.randn(2, 3, n, n), torch.randn(n, 6)
            assert_close(compiled(x, y), fn(x, y))  # bfloat16: to 1e-2
    symbolic = observe.compiled_graphs()[-1].folded_weights  # compiled again once sizes varied
    assert symbolic is not None and symbolic.names and not any("clone" in n for n in symbolic.names), symbolic
