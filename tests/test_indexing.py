"""Reads through index tensors: advanced indexing, index_select, gather, embedding, upsample."""
import pytest
import torch
import torch.nn.functional as F


def test_advanced_indexing_forms(device, check):
    x = torch.randn(7, 9, 5, device=device)
    i = torch.tensor([0, 3, -1, 2], device=device)
    check(lambda x, i: (x[i] * 2, x[:, i], x[i, :, i], x[1:, i, None]), x, i)


def test_index_with_broadcast_index_tensors(device, check):
    x = torch.randn(6, 8, device=device)
    rows = torch.tensor([[0], [5], [2]], device=device)
    cols = torch.tensor([1, 7, 3, 3], device=device)
    check(lambda x, r, c: x[r, c] + 1, x, rows, cols)


def test_index_select_fuses_with_pointwise(device, check, observe):
    x = torch.randn(7, 9, 5, device=device)
    i = torch.tensor([4, 0, 8, 8], device=device)
    check(lambda x, i: torch.index_select(x, 1, i).exp() + 1, x, i)
    assert sum(len(g.kernel_names) for g in observe.compiled_graphs()) == 1
    assert not any(g.fallback_ops for g in observe.compiled_graphs())


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(device, check, dim):
    x = torch.randn(6, 7, 5, device=device)
    size = list(x.shape)
    size[dim] = 3
    index = torch.randint(0, x.shape[dim], size, device=device)
    check(lambda x, idx: torch.gather(x, dim, idx), x, index)


def test_embedding_then_reduction(device, check):
    weight = torch.randn(10, 16, device=device)
    ids = torch.tensor([[1, 2, 9], [9, 0, 4]], device=device)
    check(lambda w, ids: F.embedding(ids, w).sum(-1), weight, ids)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample(device, check, mode):
    x = torch.randn(2, 3, 5, 6, device=device)
    check(lambda x: F.interpolate(x, scale_factor=2, mode=mode), x, atol=1e-5, rtol=1e-5)


def test_take(device, check):
    x = torch.randn(4, 5, device=device)
    idx = torch.tensor([[0, 19], [7, -1]], device=device)
    check(lambda x, i: torch.take(x, i), x, idx)


def test_boolean_mask_index_still_correct(device, check):
    x = torch.randn(5, 4, device=device)
    mask = x[:, 0] > 0
    check(lambda x, m: x[m].sum(), x, mask, compile_kw={"fullgraph": False})


def test_gather_with_an_empty_index_of_another_rank(device, check):
    # eager accepts an index whose rank differs from the input's when it has no elements
    actual, _ = check(lambda x, i: torch.gather(x, 0, i), torch.randn(5, device=device),
                      torch.empty(2, 0, dtype=torch.int64, device=device))
    assert actual.shape == (2, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_cpu_indices_into_a_cuda_tensor_run_through_aten(check):
    x = torch.randn(6, 4, device="cuda")
    i = torch.tensor([0, 2, 5])
    check(lambda x, i, v: (x[i] * 2, torch.index_put(x, (i,), v, accumulate=True)), x, i, torch.ones(3, 4, device="cuda"))
