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
