"""A CUDA kernel storing per element of whole rows (a norm, a softmax) times a few warp counts on its
first launch with SMELT_TUNE_ROWS (codegen/triton/candidates.py row_candidates), its candidates built
ahead in the compile workers."""
import glob
import os

import pytest
import torch
import torch.nn.functional as F

from smelt.runtime.autotune import Autotuner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _residual_norm(x, residual, w, b):
    return F.layer_norm(x + residual, (x.shape[-1],), w, b)


def test_a_residual_layer_norm_is_tuned_once_and_matches_eager(tmp_path, monkeypatch, observe):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SMELT_TUNE_ROWS", "1")
    timed = []
    original = Autotuner._time
    monkeypatch.setattr(Autotuner, "_time", staticmethod(lambda fn, device: timed.append(1) or original(fn, device)))
    x, residual = (torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = torch.randn(768, device="cuda", dtype=torch.bfloat16), torch.randn(768, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():  # inference: the norm's output may be written over its dying sum
        actual = torch.compile(_residual_norm, backend="smelt")(x, residual, w, b)
    torch.testing.assert_close(actual, _residual_norm(x, residual, w, b), atol=3e-2, rtol=2e-2)
    sources = [s for g in observe.compiled_graphs() for s in g.kernel_sources.values()]
    # 4 rows a program at 4, 2 and 1 warps, one row a program at 1 (test_autotune.py's row candidates)
    assert any("autotuned over 4 configs" in s for s in sources), sources
    assert len(timed) == 4 and glob.glob(os.path.join(tmp_path, "autotune", "*.json"))

    torch._dynamo.reset()  # a new compile of the same kernel reads the choice from disk
    timed.clear()
    with torch.no_grad():
        again = torch.compile(_residual_norm, backend="smelt")(x, residual, w, b)
    assert timed == [] and torch.equal(again, actual)


def test_rows_are_not_tuned_by_default(tmp_path, monkeypatch, observe):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    x = torch.randn(512, 1024, device="cuda")
    actual = torch.compile(lambda t: torch.softmax(t * 2, -1), backend="smelt")(x)
    torch.testing.assert_close(actual, torch.softmax(x * 2, -1))
    sources = [s for g in observe.compiled_graphs() for s in g.kernel_sources.values()]
    assert not any("autotuned over" in s for s in sources)
