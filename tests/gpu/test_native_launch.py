"""GPU kernels compiled by smelt and launched through the CUDA driver (smelt/runtime/cuda_binary.py):
values match eager for every kind of argument a kernel takes, and no kernel falls back to
Triton's JIT without saying so."""
import logging

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _launchers(observe):
    return [g.call.__globals__[name] for g in observe.compiled_graphs() for name in g.kernel_names]


@pytest.fixture
def no_fallback(caplog, observe):
    with caplog.at_level(logging.WARNING, logger="smelt.runtime"):
        yield
    assert "launches through Triton's JIT" not in caplog.text
    launchers = _launchers(observe)
    assert launchers and all(launcher.variants is not None for launcher in launchers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_pointwise_over_each_dtype(dtype, check, no_fallback):
    x = torch.randint(-5, 5, (1000, 37), device="cuda").to(dtype)
    y = torch.randint(-5, 5, (37,), device="cuda").to(dtype)
    check((lambda x, y: x ^ y) if dtype == torch.bool else (lambda x, y: x * 2 + y), x, y)


def test_misaligned_and_unaligned_sizes_get_their_own_variant(compile_fn, assert_close, no_fallback):
    fn = compile_fn(lambda x: x.sin() + 1)
    base = torch.randn(4099, device="cuda")
    for view in (base[:4096], base[1:4097], base[3:4098], base[:33]):  # alignment and divisibility differ
        assert_close(fn(view), view.sin() + 1)


def test_reductions_and_a_scalar_argument(check, no_fallback):
    x = torch.randn(300, 5000, device="cuda")
    check(lambda x: (F.softmax(x * 0.5, dim=-1), torch.var_mean(x, 0), x.sum()), x, rtol=1e-4, atol=1e-4)


def test_long_rows_split_over_programs(check, no_fallback):
    check(lambda x: F.log_softmax(x, dim=-1), torch.randn(8, 100003, device="cuda"), rtol=1e-5, atol=1e-5)


def test_dynamic_sizes_are_arguments(compile_fn, assert_close, no_fallback):
    fn = compile_fn(lambda x: (x.exp() * x.shape[0]).sum(-1), dynamic=True)
    for n in (5, 17, 64):
        x = torch.randn(n, 3000, device="cuda")
        assert_close(fn(x), (x.exp() * n).sum(-1), rtol=1e-4, atol=1e-3)


def test_a_second_stream_is_honoured(compile_fn, assert_close, no_fallback):
    fn = compile_fn(lambda x: x * 3)
    x = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn(x)
    torch.cuda.current_stream().wait_stream(side)
    assert_close(out, x * 3)


def test_resolved_launches_are_recalled_only_for_the_same_scalars_and_aligned_pointers(
        compile_fn, assert_close, observe, no_fallback):
    fn = compile_fn(lambda x: (x * 2).sum(-1), dynamic=True)
    base = torch.randn(64 * 3000 + 1, device="cuda")
    for n, offset in [(64, 0), (17, 0), (64, 0), (64, 1), (17, 0), (64, 1), (5, 0), (64, 0)]:
        x = base[offset:offset + n * 3000].view(n, 3000)  # offset 1: every pointer misaligned
        base.normal_()  # new values each call: a stale launch cannot pass by luck
        assert_close(fn(x), (x * 2).sum(-1), rtol=1e-4, atol=1e-3)
    (launcher,) = _launchers(observe)
    assert len(launcher._resolved) == 3  # sizes 64, 17 and 5, aligned; misaligned calls resolve anew


def test_a_backward_whose_first_op_is_ours_launches_natively():
    # Autograd runs a CUDA backward on a thread of its own, with no current CUDA context until a
    # runtime call makes one: a backward starting with a smelt kernel fell back to Triton's JIT.
    # In a fresh process, since any earlier backward leaves that thread a context.
    import subprocess
    import sys
    script = ("import torch, smelt\n"
              "x = torch.randn(4096, device='cuda', requires_grad=True)\n"
              "torch.compile(lambda t: (t.sin() * t).sum(), backend='smelt')(x).backward()\n"
              "d = x.detach()\n"
              "torch.testing.assert_close(x.grad, d.cos() * d + d.sin())\n"
              "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
    assert "launches through Triton's JIT" not in done.stderr, done.stderr[-3000:]


def test_a_tuned_kernel_is_recalled_once_tuned(compile_fn, assert_close, observe, no_fallback, tmp_path):
    """Autotuned launches took the whole launch path at every call (a likely part of a tuned
    EfficientNet's 2.4x wall on the H200): once tuned, a launch is remembered like any other."""
    import smelt.config
    with smelt.config.override(autotune="1", cache_dir=str(tmp_path)):
        fn = compile_fn(lambda x: (x * 2).sum(-1))
        x = torch.randn(64, 3000, device="cuda")
        for _ in range(3):
            x.normal_()
            assert_close(fn(x), (x * 2).sum(-1), rtol=1e-4, atol=1e-3)
    (launcher,) = _launchers(observe)
    assert launcher.autotuner is not None and len(launcher.autotuner.configs) > 1
    assert len(launcher._resolved) == 1
