"""Programs eager runs that smelt must run the same way: data-dependent sizes, integer
arithmetic, special values, output strides, out-of-range scalars and indices."""
import pytest
import torch
import torch._dynamo

data_dependent = torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True)


# --- unbacked sizes: the wrapper binds u0 from the ATen call that produces it -----------------

@data_dependent
@pytest.mark.parametrize("fn", [
    lambda x: torch.nonzero(x > 0),
    lambda x: x[x > 0] * 2,
    lambda x: x[x > 0].sum(),
    lambda x: (x[x > 0].sum(), x[x < 0] + 1),
    lambda x: torch.masked_select(x, x > 0).exp(),
    lambda x: torch.unique(x.round(), return_counts=True),
    lambda x: torch.repeat_interleave(x, (x.abs() * 2).long()) + 1,
    lambda x: torch.zeros(int((x > 0).sum().item()), 3) + 1,
], ids=["nonzero", "mask", "mask_sum", "two_masks", "masked_select", "unique", "repeat_interleave", "item_size"])
def test_unbacked_sizes(check, device, fn):
    check(fn, torch.randn(64, device=device))


# --- output layouts: a view of a computed tensor keeps eager's strides and offset -------------

def _check_layouts(actual, expected):
    actual = actual if isinstance(actual, tuple) else (actual,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert (a.shape, a.stride(), a.storage_offset()) == (e.shape, e.stride(), e.storage_offset()), \
            f"output {k}: size/stride/offset {a.shape, a.stride(), a.storage_offset()} != eager's " \
            f"{e.shape, e.stride(), e.storage_offset()}"


@pytest.mark.parametrize("fn", [
    lambda x: (x + 1).t(),
    lambda x: (x + 1).reshape(2, 3, 8).permute(2, 0, 1),
    lambda x: (x + 1).transpose(0, 1),
    lambda x: (x[:, :1] + 1).expand(6, 8),
    lambda x: (x + 1)[::2],
    lambda x: (x + 1)[:, 1::3],
    lambda x: (x + 1).diagonal(),
    lambda x: (x + 1).unsqueeze(1),
    lambda x: (x + 1)[2],
    lambda x: (x + 1)[:, 2],
    lambda x: (x + 1).view(8, 6).t(),
    lambda x: ((x + 1).t(), x * 2),
    lambda x: (x.t() * 2, x.t().contiguous() + 1),
    lambda x: x.sum(0, keepdim=True).t(),
], ids=["t", "permute", "transpose", "expand", "rows_step", "cols_step", "diagonal", "unsqueeze", "select_row",
        "select_col", "view_t", "two_outputs", "dense_transposed", "reduction_t"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_output_strides_are_eagers(check, device, fn, dynamic):
    actual, expected = check(fn, torch.randn(6, 8, device=device), compile_kw={"dynamic": dynamic})
    _check_layouts(actual, expected)
