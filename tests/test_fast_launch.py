"""The C launcher (runtime/launch_ext.c, built by runtime/fast_launch.py), run on the CPU against a
stand-in for cuLaunchKernel that records what it was given: the grid, block, stream and every
parameter's bytes as a kernel would read them."""
import ctypes
import struct

import pytest
import torch

from smelt.runtime import fast_launch

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return fast_launch.load_module(fast_launch.build(str(tmp_path_factory.mktemp("cache"))))


class Recorder:
    """A cuLaunchKernel stand-in: keeps each call's values, reads `count` parameters of 8 bytes."""

    def __init__(self, module, count: int, status: int = 0):
        self.calls = []
        self.count = count

        def launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            raw = [ctypes.string_at(params[i], 8) for i in range(self.count)]
            self.calls.append(dict(function=function, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared,
                                   stream=stream, params=raw, extra=extra))
            return status
        self.callback = LAUNCH(launch)  # kept alive while the module holds its address
        module.set_driver(ctypes.cast(self.callback, ctypes.c_void_p).value)


def test_every_argument_kind_reaches_the_kernel_as_its_bytes(module):
    recorder = Recorder(module, 7)
    x = torch.zeros(64)
    status = module.launch(0x1234, 3, 2, 1, 128, 1024, 0x77, b"pilfp", (x, -5, 2**40, 1.5, x[4:]), 2, True)
    assert status == 0
    (call,) = recorder.calls
    assert call["function"] == 0x1234 and call["grid"] == (3, 2, 1) and call["block"] == (128, 1, 1)
    assert call["shared"] == 1024 and call["stream"] == 0x77 and call["extra"] is None
    p = call["params"]
    assert struct.unpack("<Q", p[0])[0] == x.data_ptr()
    assert struct.unpack("<i", p[1][:4])[0] == -5
    assert struct.unpack("<q", p[2])[0] == 2**40
    assert struct.unpack("<f", p[3][:4])[0] == 1.5
    assert struct.unpack("<Q", p[4])[0] == x.data_ptr() + 16
    assert p[5] == p[6] == bytes(8)  # the extra parameters: null pointers


def test_a_misaligned_pointer_launches_nothing_when_alignment_was_assumed(module):
    recorder = Recorder(module, 1)
    x = torch.zeros(64)
    assert module.launch(1, 1, 1, 1, 32, 0, 0, b"p", (x[1:],), 0, True) == -1
    assert recorder.calls == []
    assert module.launch(1, 1, 1, 1, 32, 0, 0, b"p", (x[1:],), 0, False) == 0
    assert len(recorder.calls) == 1


def test_the_drivers_error_comes_back(module):
    Recorder(module, 0, status=700)
    assert module.launch(1, 1, 1, 1, 32, 0, 0, b"", (), 0, False) == 700


@pytest.mark.parametrize("kinds, args, error", [
    (b"i", (2**31,), OverflowError),
    (b"p", (3,), AttributeError),
    (b"x", (3,), ValueError),
    (b"ii", (3,), ValueError),
])
def test_bad_arguments_raise_and_launch_nothing(module, kinds, args, error):
    recorder = Recorder(module, 0)
    with pytest.raises(error):
        module.launch(1, 1, 1, 1, 32, 0, 0, kinds, args, 0, False)
    assert recorder.calls == []


def test_the_build_is_kept_and_reused(tmp_path):
    path = fast_launch.build(str(tmp_path))
    stamp = (tmp_path / path).stat().st_mtime_ns
    assert fast_launch.build(str(tmp_path)) == path
    assert (tmp_path / path).stat().st_mtime_ns == stamp
