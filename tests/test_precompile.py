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

pytestmark = pytest.mark.skipif(not hasattr(torch._dynamo, "aot_compile"),
                                reason="this torch has no precompile (torch._dynamo.aot_compile)")

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
