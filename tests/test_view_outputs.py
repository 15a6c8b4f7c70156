"""A graph output that eager returns as a view of another output is a view in smelt too, not a copy.

`aten.alias` was lowered as a copy: a training forward that saved each attention output through
alias(alias(out)) stored it twice (Qwen2 on the H100: 8 MiB a layer, most of its peak above Inductor's).
Each view op is checked the same way: two outputs, one storage, as eager has them.
"""
import pytest
import torch

from conftest import DEVICE

aten = torch.ops.aten

VIEWS = {
    "alias": lambda y: aten.alias(y),
    "view": lambda y: y.view(8, 6),
    "reshape": lambda y: y.reshape(6, 8),
    "permute": lambda y: y.permute(1, 0),
    "t": lambda y: y.t(),
    "transpose": lambda y: y.transpose(0, 1),
    "slice": lambda y: y[1:3],
    "select": lambda y: y[2],
    "unsqueeze": lambda y: y.unsqueeze(0),
    "squeeze": lambda y: y.unsqueeze(0).squeeze(0),
    "expand": lambda y: y[:1].expand(3, 12),
    "diagonal": lambda y: y.diagonal(),
    "unfold": lambda y: y.unfold(1, 3, 2),
    "split": lambda y: y.split(2)[1],
    "unbind": lambda y: y.unbind(0)[1],
    "as_strided": lambda y: y.as_strided((2, 2), (12, 1), 1),
    "view_dtype": lambda y: y.view(torch.int32),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_view_output_shares_its_bases_storage(name):
    view = VIEWS[name]

    def f(x):
        y = x * 2  # a value made in the graph: its memory is the graph's
        return y, view(y)
    x = torch.randn(4, 12, device=DEVICE)
    torch._dynamo.reset()
    base, got = torch.compile(f, backend="smelt")(x)
    want_base, want = f(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(base, want_base)
    assert got.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype,as_dtype", [(torch.float32, torch.int32), (torch.bfloat16, torch.int16)])
def test_a_dtype_view_inside_the_graph_reads_the_bits(dtype, as_dtype):
    """`view(dtype)` reinterprets the bits (ATen's view); reshape's lowering took the dtype for a size."""
    def f(x):
        return ((x * 2).view(as_dtype) & 0xFF) + 1
    x = torch.randn(4, 12, device=DEVICE, dtype=dtype)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="smelt")(x), f(x))
