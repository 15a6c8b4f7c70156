"""PyTorch's OpInfo samples through smelt on the CPU: no op may fail outside the known list."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

KNOWN = pathlib.Path(__file__).with_name("opinfo_known_failures_cpu_float32.txt")


@pytest.mark.smelt_only
def test_opinfo_failures_stay_within_the_known_list(device, tmp_path):
    if device != "cpu":
        pytest.skip("the GPU check runs the OpInfo runner on its own")
    report = tmp_path / "opinfo.json"
    env = dict(os.environ)  # the CPU backend under test (conftest sets it)
    # OPINFO_EVERY=N runs every Nth op from the OPINFO_FIRST-th: `make test` runs the even ops under
    # the newest Triton and the odd ones under Triton 3.6, so each op meets Triton's interpreter once
    # (the whole list took 141 s on 2 cores under Halide alone: each op's samples compile as one program).
    every = os.environ.get("OPINFO_EVERY", "1")
    first = os.environ.get("OPINFO_FIRST", "0")
    subprocess.run([sys.executable, "-m", "smelt.tools.opinfo", "--device", "cpu", "--dtype", "float32",
                    "--jobs", str(min(4, os.cpu_count() or 2)), "--every", every, "--first", first, "--json", str(report)],
                   check=True, env=env, capture_output=True, timeout=1500)
    results = json.loads(report.read_text())
    known = {line.split("\t")[0] for line in KNOWN.read_text().splitlines() if line and not line.startswith("#")}
    failing = {r["name"]: r["reason"] for r in results["results"] if r["status"] in ("fail", "error")}
    new = {name: reason for name, reason in failing.items() if name not in known}
    assert not new, "ops that newly fail (fix them; do not add them to the list):\n" + "\n".join(
        f"{name}: {reason}" for name, reason in sorted(new.items()))
    assert results["summary"]["pass_rate"] >= 0.98, results["summary"]  # issue 3's acceptance


class _FakeOp:
    """What run_op reads of an OpInfo: names, samples, and the op to call."""
    name, variant_test_name = "fake_op", ""

    def __init__(self, fn, shapes):
        self.fn, self.shapes = fn, shapes

    def sample_inputs(self, device, dtype, requires_grad=False):
        # Not OpInfo's SampleInput: importing torch.testing._internal freezes cuDNN's global flags for
        # the rest of this worker's tests.
        import types
        import torch
        return [types.SimpleNamespace(input=torch.randn(*shape, device=device, dtype=dtype), args=(), kwargs={})
                for shape in self.shapes]

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


@pytest.mark.smelt_only
def test_the_runner_names_the_sample_a_batched_compile_hides(device):
    """The runner compiles an op's samples as one program; one wrong sample there sends the op through
    the samples one by one, and the result names that sample. The fake op is wrong only when compiled
    and only on a 3-row input (the second sample)."""
    import torch
    from smelt.tools.opinfo import run_op

    def off_when_compiled(x):
        return x + 1 if torch.compiler.is_compiling() and x.shape[0] == 3 else x * 1
    result = run_op(_FakeOp(off_when_compiled, [(2, 4), (3, 4), (5, 4)]), device, torch.float32, 3)
    assert result.status == "fail" and result.reason.startswith("sample 2:"), result
    result = run_op(_FakeOp(lambda x: x * 2, [(2, 4), (3, 4), (5, 4)]), device, torch.float32, 3)
    assert result.status == "pass", result


def test_a_samples_call_is_rebuilt_with_its_containers_and_constants():
    """The runner rebuilds each sample's call from new tensors by a generated literal (Dynamo traces
    it in milliseconds, pytree's unflatten in 0.1 s): tuples stay tuples, lists lists, constants the
    same objects; a container the literal cannot spell (a named tuple of tensors) goes through pytree."""
    import collections
    import types
    import torch
    from torch.utils._pytree import tree_flatten
    from smelt.tools.opinfo import _split_tensors
    a, b, c = torch.randn(2), torch.randn(3), torch.randn(4)
    size = torch.Size([2, 1])
    sample = types.SimpleNamespace(input=[a, (b,)], args=((), [], size, None, torch.float16),
                                   kwargs={"dim": 1, "out_of": {"x": c, 3: "s"}})
    tensors, rebuild = _split_tensors(sample)
    assert rebuild.__name__ == "<lambda>" and [t is u for t, u in zip(tensors, (a, b, c))] == [True] * 3
    new = [torch.zeros(2), torch.zeros(3), torch.zeros(4)]
    (args, kwargs) = rebuild(new)
    assert type(args[0]) is list and type(args[0][1]) is tuple and args[0][0] is new[0] and args[0][1][0] is new[1]
    assert args[1:] == ((), [], size, None, torch.float16) and args[3] is size
    assert kwargs == {"dim": 1, "out_of": {"x": new[2], 3: "s"}}
    want = tree_flatten(((new[0:1] + [(new[1],)], (), [], size, None, torch.float16),
                         {"dim": 1, "out_of": {"x": new[2], 3: "s"}}))[1]
    assert tree_flatten(rebuild(new))[1] == want
    pair = collections.namedtuple("pair", "x y")
    tensors, rebuild = _split_tensors(types.SimpleNamespace(input=pair(a, b), args=(), kwargs={}))
    assert rebuild.__name__ == "rebuild" and type(rebuild(new[:2])[0][0]) is pair
