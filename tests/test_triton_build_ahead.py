"""GPU kernels compiled in worker processes before a graph's first call (triton_loading.build_ahead).

Checked on the CPU through SMELT_CHECK_CUDA_COMPILE: each interpreted kernel's CUDA form is compiled
for sm_90 at its first launch with the launch's real argument description. When codegen's guess
of that description (GeneratedKernel.launch_guess) is right, the workers have already kept the
binary and the launch compiles nothing in this process."""
import pytest
import torch
import torch.nn.functional as F

import smelt
from smelt.runtime import compile_pool, kernel_binaries

pytestmark = [pytest.mark.smelt_only]


def _programs():
    def pointwise_and_rows(x, w, b):
        y = torch.softmax(x @ w, -1).relu() + b
        return y.sum(0), F.layer_norm(y, (y.shape[-1],)), x[1:].cumsum(0)

    def slices_of_one_storage(x, y):
        # cat writes each part into a slice of one buffer: some slices start off 16-byte boundaries.
        return torch.cat([x * 2, y.sin(), x[:, :3] + 1], dim=1).tanh()

    def indices_masks_and_halves(table, idx, mask):
        rows = F.embedding(idx, table).to(torch.bfloat16)
        return torch.where(mask[:, None], rows, 0).float().sum(-1), table.half().amax(0)

    def split_global_sum(x):
        return (x * x).sum(), x.abs().max()

    def dropout(x):
        return F.dropout(x, 0.3, training=True) * 2

    def row_split_softmax(x):  # on the GPU a few long rows are split over programs with a workspace
        return torch.softmax(x, -1)

    return [
        (pointwise_and_rows, (torch.randn(64, 64), torch.randn(64, 64), torch.randn(64))),
        (slices_of_one_storage, (torch.randn(16, 5), torch.randn(16, 3))),
        (indices_masks_and_halves, (torch.randn(50, 24), torch.randint(0, 50, (30,)), torch.rand(30) > 0.5)),
        (split_global_sum, (torch.randn(1 << 17),)),
        (dropout, (torch.randn(1000),)),
        (row_split_softmax, (torch.randn(4, 20000),)),
    ]


@pytest.mark.parametrize("index", range(6), ids=[f.__name__ for f, _ in _programs()])
def test_codegen_guesses_each_launch_so_workers_compile_every_kernel(index, tmp_path, monkeypatch):
    fn, args = _programs()[index]
    compiled_here = []
    compile_binary = kernel_binaries.compile_binary
    monkeypatch.setattr(kernel_binaries, "compile_binary",
                        lambda f, spec, *a, **k: compiled_here.append(spec) or compile_binary(f, spec, *a, **k))
    torch._dynamo.reset()
    with smelt.config.override(cpu_backend="triton", check_cuda_compile=True, graph_cache=True, compile_workers=2,
                               cache_dir=str(tmp_path)):
        actual = torch.compile(fn, backend="smelt")(*args)
    if fn.__name__ != "dropout":
        for a, e in zip(actual, fn(*args)):
            torch.testing.assert_close(a, e)
    assert compiled_here == []  # every CUDA form was found kept: the guesses were the launches


def test_a_worker_starts_warm_for_triton_without_torch():
    worker = compile_pool._Worker()
    try:
        worker.send({"backend": "triton", "warm": True, "name": "warm-up"})
        reply = worker.compile({"backend": "triton", "name": "k", "path": "/nonexistent/k.py", "spec": [],
                                "constexprs": {}, "num_warps": 4, "capability": [9, 0], "options": {},
                                "folder": "/nonexistent/folder"})
    finally:
        worker.close()
    assert reply["ok"] is False and "nonexistent" in reply["error"] and reply["torch_loaded"] is False
