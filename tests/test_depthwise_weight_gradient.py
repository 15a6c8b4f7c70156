"""smelt::depthwise_weight_gradient (smelt/runtime/depthwise_weight_gradient.py), the kernel alone:
against a float64 reference over windows, strides, paddings, channel counts that split into several
blocks or leave strides no vector divides, several runs of partial sums, and other layouts."""
import pytest
import torch

from smelt.config import Config, SettingError
from smelt.runtime.depthwise_weight_gradient import Blocks, choose_blocks, run

CASES = [
    # (N, C, H, W, kernel, stride, padding)
    (2, 5, 9, 7, (3, 3), (1, 1), (1, 1)),  # 5 channels: strides no vector of 2 divides
    (2, 40, 11, 10, (5, 5), (2, 2), (2, 2)),  # EfficientNet's strided 5x5, channels over one block
    (1, 3, 6, 6, (3, 3), (2, 2), (0, 0)),  # no padding: the last row and column never read
    (3, 17, 7, 7, (5, 5), (1, 1), (2, 2)),  # the last stages' 7x7 maps
    (2, 8, 7, 12, (1, 5), (2, 1), (0, 2)),  # a rectangular window and stride
    (2, 24, 8, 9, (2, 2), (1, 1), (0, 0)),  # an even window
]


def _reference(grad, x, kernel, stride, padding):
    c = x.shape[1]
    weight = torch.zeros(c, 1, *kernel, dtype=torch.float64, device=x.device)
    return torch.ops.aten.convolution_backward(grad.double(), x.double(), weight, None, list(stride), list(padding),
                                               [1, 1], False, [0, 0], c, [False, True, False])[1]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"c{c[1]}-k{c[4]}-s{c[5]}-p{c[6]}")
@pytest.mark.parametrize("blocks", [None, Blocks(16, 2, 4, 3)], ids=["chosen", "three-runs"])
def test_matches_float64(device, case, blocks):
    n, c, h, w, kernel, stride, padding = case
    torch.manual_seed(0)
    x = torch.randn(n, c, h, w, device=device).contiguous(memory_format=torch.channels_last)
    out_size = [(s + 2 * p - k) // st + 1 for s, k, st, p in zip((h, w), kernel, stride, padding)]
    grad = torch.randn(n, c, *out_size, device=device).contiguous(memory_format=torch.channels_last)
    actual = run(grad, x, list(kernel), list(stride), list(padding), torch.float32, blocks)
    exact = _reference(grad, x, kernel, stride, padding)
    assert actual.shape == (c, 1, *kernel) and actual.dtype == torch.float32
    torch.testing.assert_close(actual.double(), exact, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_other_layouts_are_read_right(device, layout):
    """The kernel reads channels-last memory; other layouts are copied to it first."""
    torch.manual_seed(0)
    x = torch.randn(2, 12, 9, 9, device=device)
    grad = torch.randn(2, 12, 9, 9, device=device)
    if layout == "strided":
        x = torch.randn(2, 24, 9, 9, device=device)[:, ::2]
    actual = run(grad, x, [3, 3], [1, 1], [1, 1], torch.float32)
    torch.testing.assert_close(actual.double(), _reference(grad, x, (3, 3), (1, 1), (1, 1)), atol=1e-5, rtol=1e-5)


def test_bfloat16_sums_in_float32_and_rounds_once(device):
    torch.manual_seed(0)
    x = torch.randn(4, 16, 15, 15, device=device, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    grad = torch.randn(4, 16, 8, 8, device=device, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    actual = run(grad, x, [5, 5], [2, 2], [2, 2], torch.bfloat16)
    exact = _reference(grad, x, (5, 5), (2, 2), (2, 2))
    assert actual.dtype == torch.bfloat16
    assert ((actual.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-6).all()


def test_an_empty_batch_gives_zeros(device):
    x = torch.randn(0, 4, 5, 5, device=device).contiguous(memory_format=torch.channels_last)
    grad = torch.randn(0, 4, 5, 5, device=device)
    assert run(grad, x, [3, 3], [1, 1], [1, 1], torch.float32).eq(0).all()


def test_blocks_keep_every_multiprocessor_busy():
    blocks = choose_blocks(channels=144, out_width=56, rows=32 * 56, taps=9, sms=132)
    assert blocks.channels == 32 and blocks.outputs == 16  # a [16, 16, 32] tile of 8192 elements
    assert blocks.runs * 5 >= 8 * 132  # five channel blocks
    assert choose_blocks(channels=4, out_width=3, rows=2, taps=25, sms=132).runs == 2  # no run without a row


@pytest.mark.parametrize("channels, taps, expected", [
    (144, 9, (32, 16)),  # 64 would pad 144 to 192
    (72, 25, (32, 1)),
    (240, 9, (64, 8)),  # 256: a fifteenth padded
    (1152, 25, (64, 1)),  # a 5x5 window: one output a strip
    (16, 9, (16, 32)),  # fewer channels than a block: the block shrinks to them
])
def test_blocks_follow_the_sweep(channels, taps, expected):
    blocks = choose_blocks(channels=channels, out_width=56, rows=32 * 56, taps=taps, sms=132)
    assert (blocks.channels, blocks.outputs) == expected


def test_the_setting_names_its_accepted_values(monkeypatch):
    monkeypatch.setenv("SMELT_DEPTHWISE_WEIGHT_GRADIENT", "cudnn")
    with pytest.raises(SettingError, match="SMELT_DEPTHWISE_WEIGHT_GRADIENT.*kernel, library, reduction"):
        Config()


def test_offsets_past_two_to_the_31_within_one_image(tmp_path):
    """A gradient whose rows lie more than 2**31 elements apart (a sparse file maps them): each
    offset is taken in int64. In int32, oh * row_stride wrapped and the last rows read elsewhere."""
    row_stride, offset = 2 ** 30 + 1, 2 ** 31  # odd: no vector width divides the strides
    n, c, oh, ow = 1, 3, 4, 5
    numel = offset + oh * row_stride + ow * c + 16
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(numel * 4)  # reads as zeros; only the pages written below take disk
    try:
        storage = torch.from_file(str(path), shared=True, size=numel, dtype=torch.float32)
    except RuntimeError as e:
        pytest.skip(f"no sparse 8 GiB mapping here: {e}")
    grad = storage.as_strided((n, c, oh, ow), (oh * row_stride, 1, row_stride, c), offset)
    torch.manual_seed(0)
    values = torch.randn(n, c, oh, ow)
    grad.copy_(values)
    x = torch.randn(n, c, oh, ow).contiguous(memory_format=torch.channels_last)
    actual = run(grad, x, [3, 3], [1, 1], [1, 1], torch.float32)
    torch.testing.assert_close(actual.double(), _reference(values, x, (3, 3), (1, 1), (1, 1)), atol=1e-5, rtol=1e-5)
