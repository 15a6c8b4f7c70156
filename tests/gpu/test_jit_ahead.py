"""smelt's hand-written Triton kernels compiled ahead in a compile worker (runtime/jit_ahead.py): the
worker's compile lands under the key Triton's JIT looks up at the kernel's first launch, so the
launch compiles nothing (CUDA only)."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from smelt.runtime import biased_head, compile_worker, jit_ahead

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _head(m, k, n):
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 8
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    rows = torch.empty(m, n + -n % 8, device="cuda", dtype=torch.bfloat16)
    return rows[:, :n], a, w, bias


def _compiled_in_a_worker(job: dict, cache: str) -> str:
    """Runs the job in a fresh process as a compile worker would; the cache key of what it compiled."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    reply = subprocess.run([sys.executable, compile_worker.__file__], input=json.dumps(job) + "\n", text=True,
                           capture_output=True, env={**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": root},
                           check=True).stdout
    assert json.loads(reply)["ok"], reply
    assert not json.loads(reply)["torch_loaded"]
    folders = _kernel_folders(cache, job["name"])
    assert len(folders) == 1, folders
    with open(os.path.join(cache, folders[0], job["name"] + ".json")) as f:
        return json.load(f)["hash"]


def _kernel_folders(cache: str, name: str) -> list[str]:
    """Folders of Triton's cache holding a compile of kernel `name` (others hold its launcher's build)."""
    return [f for f in os.listdir(cache) if os.path.exists(os.path.join(cache, f, name + ".cubin"))]


@pytest.mark.parametrize("m, k, n", [(4096 + 8, 768, 30522), (200, 96, 1000)])
def test_the_heads_first_launch_finds_the_workers_compile(m, k, n, tmp_path):
    import triton
    out, a, w, bias = _head(m, k, n)
    fake_mode = torch._subclasses.fake_tensor.FakeTensorMode()
    with fake_mode:  # planned as the graph plans it: fake tensors, no addresses
        planned = biased_head.ahead_launches(*(fake_mode.from_tensor(t) for t in (out, a, w, bias)))
    assert len(planned) == 1
    job = jit_ahead._job(planned[0])
    assert job is not None and job["backend"] == "triton_jit"
    key = _compiled_in_a_worker(job, str(tmp_path))
    with triton.knobs.cache.scope():
        triton.knobs.cache.dir = str(tmp_path)
        biased_head.product_into(out, a, w, bias)
    torch.cuda.synchronize()
    # The JIT's kernel for this launch is the worker's (the same cache key): nothing else was
    # compiled into the folder.
    kernels = biased_head.biased_head_product.device_caches[torch.cuda.current_device()][0].values()
    assert key in {getattr(k, "hash", None) for k in kernels}
    assert len(_kernel_folders(str(tmp_path), job["name"])) == 1
    torch.testing.assert_close(out, F.linear(a, w, bias), atol=0.25, rtol=2e-2)


def test_a_padded_head_in_a_graph_is_handed_to_the_workers(monkeypatch):
    """Planning a graph with BERT's kind of head submits its kernel's compile (workers on)."""
    submitted = []
    monkeypatch.setattr("smelt.runtime.compile_pool.submit", lambda jobs, workers: submitted.extend(jobs) or _Done())
    monkeypatch.setattr(jit_ahead, "_pending", {})
    import smelt
    torch.manual_seed(0)
    # Big enough to be padded (lowering/matmul_padding.py's MIN_MACS): 512 x 768 x 1001.
    head = torch.nn.Linear(768, 1001).to(device="cuda", dtype=torch.bfloat16)
    h = torch.randn(4, 128, 768, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    with smelt.config.override(compile_workers=2), torch.no_grad():
        out = torch.compile(head, backend="smelt")(h)
        torch.testing.assert_close(out, head(h), atol=0.25, rtol=2e-2)
    assert [j["name"] for j in submitted] == ["biased_head_product"]


class _Done:
    done = True

    def wait(self):
        return []
