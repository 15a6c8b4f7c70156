"""Triton's interpreter from several threads at once (smelt/runtime/interpreter_compat.py): it keeps a
launch's program id and its patches of triton.language in the process, so launches take turns."""
import os

import pytest
import torch
from conftest import failures_in_threads

pytestmark = pytest.mark.skipif(os.environ.get("SMELT_CPU_BACKEND") != "triton",
                                reason="runs CPU kernels in Triton's interpreter")


def test_threads_launching_interpreted_kernels_at_once(compile_fn):
    import triton.language as tl
    patched_names = ("load", "store", "program_id", "arange")
    before = {name: getattr(tl, name) for name in patched_names}

    def fn(x):
        return torch.softmax(x * 1.5, -1) + x.sum(0)  # two kernels, each over several programs
    compiled = compile_fn(fn)
    compiled(torch.randn(64, 96))  # compiled before the threads

    def worker(seed):
        x = torch.randn(64, 96, generator=torch.Generator().manual_seed(seed))
        for _ in range(6):
            assert torch.allclose(compiled(x), fn(x), atol=1e-5, rtol=1e-5), "wrong values"
    failures = failures_in_threads(worker, 4)  # an interpreter left in another launch's state raises
    assert not failures, failures
    assert {name: getattr(tl, name) for name in patched_names} == before  # nothing left patched
