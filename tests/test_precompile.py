"""torch's precompile with smelt (smelt/precompile.py): `torch.compile(..., backend="smelt").aot_compile`,
saved, then loaded and called in a fresh process, against eager; the load served by smelt's graph
cache where it holds the graph, compiled again where it does not."""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE

import smelt

from smelt import precompile

pytestmark = pytest.mark.skipif(not precompile.available(),
                                reason="this torch has no precompile (torch.compile(...).aot_compile)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROGRAM = """
import json, sys, torch, smelt
from smelt.graph_cache import stats

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.norm(self.conv(x)))
        return torch.softmax(self.head(y.mean((2, 3))), -1)

device = sys.argv[5]
torch.manual_seed(0)
net = Net().eval().to(device)
with torch.no_grad():
    net.norm.running_mean.uniform_(-0.5, 0.5)
    net.norm.running_var.uniform_(0.5, 2.0)
x = torch.randn(2, 3, 10, 10, device=device)
step, path, training = sys.argv[1], sys.argv[2], sys.argv[3] == "train"
if training:
    net.train()
    x.requires_grad_(True)
grad = torch.enable_grad() if training else torch.no_grad()
if step == "save":
    with grad:
        torch.compile(net.forward, fullgraph=True, backend="smelt", dynamic=sys.argv[4] == "dynamic") \\
            .aot_compile(((x,), {})).save_compiled_function(path)
    print(json.dumps({"saved": True}))
else:
    with open(path, "rb") as f:
        loaded = torch.compiler.load_compiled_function(f)
    copy = Net().to(device)
    copy.load_state_dict(net.state_dict())
    copy.train(training)
    with grad:
        out = loaded(net, x)
        want = copy(x)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    if training:
        weights = torch.randn_like(want)
        got = torch.autograd.grad((out * weights).sum(), [x, *net.parameters()])
        expected = torch.autograd.grad((want * weights).sum(), [x, *copy.parameters()])
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(net.norm.running_mean, copy.norm.running_mean)
    # Served from the cache: at the Dynamo graph's level, or at the ATen graph's where the weights are
    # frozen (an inference graph's prologue keeps the Dynamo level out).
    print(json.dumps({"hits": stats["dynamo_hit"] + stats["aten_hit"], "misses": stats["aten_miss"]}))
"""


def _run(step: str, path, cache, mode: str = "infer", dynamic: str = "static") -> subprocess.CompletedProcess:
    env = dict(os.environ, SMELT_CACHE_DIR=str(cache), SMELT_GRAPH_CACHE="1", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", _PROGRAM, step, str(path), mode, dynamic, DEVICE], env=env,
                          capture_output=True, text=True, timeout=600)


def _result(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_a_precompiled_graph_loads_in_a_fresh_process_from_the_cache_and_matches_eager(tmp_path, mode):
    saved = tmp_path / "net.bin"
    _result(_run("save", saved, tmp_path / "cache", mode))
    # The same cache: the load finds the graph the save compiled, and compiles nothing.
    assert _result(_run("load", saved, tmp_path / "cache", mode)) == {"hits": 1, "misses": 0}
    # Another machine's empty cache: compiled again, as correct.
    assert _result(_run("load", saved, tmp_path / "empty", mode))["hits"] == 0


def test_a_precompile_of_symbolic_sizes_names_what_is_not_supported(tmp_path):
    done = _run("save", tmp_path / "net.bin", tmp_path / "cache", "infer", "dynamic")
    assert done.returncode != 0
    assert "precompile (aot_compile) of a graph with symbolic sizes is not supported" in done.stderr, \
        done.stderr[-4000:]


def _saved_and_loaded(fn, args, path):
    torch.compile(fn, fullgraph=True, backend="smelt").aot_compile((args, {})).save_compiled_function(str(path))
    torch._dynamo.reset()
    with open(path, "rb") as f:
        return torch.compiler.load_compiled_function(f)


def _scaled_tanh_rows(x, w):
    return (x * w).tanh().sum(-1)


def test_an_input_that_is_not_a_leaf_is_loaded_as_one_and_gets_its_gradient(tmp_path):
    # Whether an input needing grad is a leaf is in the graph's key (a training graph detaches some
    # of its leaves, graph_cache/training_graph.py): the load makes a non-leaf input again, and
    # finds the graph the save compiled.
    from smelt.graph_cache import stats
    w = torch.randn(6, device=DEVICE, requires_grad=True)
    a = torch.randn(4, 6, device=DEVICE, requires_grad=True)
    x = a * 2
    hits = stats["dynamo_hit"]
    with smelt.config.override(graph_cache=True, cache_dir=str(tmp_path / "cache")):
        loaded = _saved_and_loaded(_scaled_tanh_rows, (x, w), tmp_path / "fn.bin")
    assert stats["dynamo_hit"] == hits + 1
    got = loaded(x, w)
    want = _scaled_tanh_rows(x, w)
    torch.testing.assert_close(got, want)
    for g, e in zip(torch.autograd.grad(got.sum(), (a, w), retain_graph=True), torch.autograd.grad(want.sum(), (a, w))):
        torch.testing.assert_close(g, e)


def _add(p, q):
    return p + q


def test_a_precompile_of_inputs_sharing_memory_names_what_is_not_supported():
    v = torch.randn(6, device=DEVICE)
    with pytest.raises(Exception, match="inputs share memory is not supported"):
        torch.compile(_add, fullgraph=True, backend="smelt").aot_compile(((v[:3], v[3:]), {}))
    torch._dynamo.reset()
