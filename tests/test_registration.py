"""Backend registration and the public entry points (smelt only)."""

import pytest
import torch

pytestmark = [pytest.mark.smelt_only, pytest.mark.cpu_backend_independent]


def _fn(x):
    return torch.relu(x) * 2 + 1


def test_smelt_is_listed_in_dynamo_backends():
    import smelt  # noqa: F401

    assert "smelt" in torch._dynamo.list_backends()


def test_torch_compile_with_backend_string_works(device, assert_close):
    import smelt  # noqa: F401

    x = torch.randn(17, 33, device=device)
    assert_close(torch.compile(_fn, backend="smelt")(x), _fn(x))


def test_smelt_compile_convenience_works(device, assert_close, observe):
    import smelt

    x = torch.randn(17, 33, device=device)
    assert_close(smelt.compile(_fn)(x), _fn(x))
    assert len(observe.compiled_graphs()) == 1


def test_smelt_compile_forwards_options(device, assert_close, observe):
    import smelt

    compiled = smelt.compile(_fn, dynamic=True, fullgraph=True)
    for n in (4, 3, 5, 11):
        x = torch.randn(n, 33, device=device)
        assert_close(compiled(x), _fn(x))
    assert len(observe.compiled_graphs()) == 1


def test_smelt_compile_accepts_module(device, assert_close):
    import smelt

    lin = torch.nn.Linear(33, 9).to(device)
    x = torch.randn(17, 33, device=device)
    with torch.no_grad():
        assert_close(smelt.compile(lin)(x), lin(x), atol=1e-5, rtol=1e-5)


def test_kernel_compile_error_is_an_exception_class():
    import smelt.errors

    assert issubclass(smelt.errors.KernelCompileError, Exception)


def test_import_freezes_what_it_imported_and_thaws_at_exit():
    # Dynamo's first trace in a process ran 3x slower while the collector rescanned torch's,
    # Triton's and sympy's import-time objects; the exit is quiet (nanobind reports leaks if not).
    import os
    import subprocess
    import sys

    code = "import gc, smelt; print(gc.get_freeze_count())"
    frozen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    frozen_count = int(frozen.stdout.split()[-1])
    assert frozen_count > 100_000, frozen.stderr
    assert "leaked" not in frozen.stderr
    env = {**os.environ, "SMELT_GC_FREEZE": "0"}
    thawed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    # Another library may freeze a few objects of its own (375 with torch 2.11 on the GPU machine).
    assert int(thawed.stdout.split()[-1]) < frozen_count // 10, thawed.stderr


def test_import_skips_dynamos_guard_latency_profile(device, assert_close):
    # The profile flushes the CPU caches to time a frame's guards once, for a metric: 20-25 ms of a
    # 70 ms warm first call. Compiled frames still guard correctly without it.
    import os
    import subprocess
    import sys

    import torch._dynamo.guards as guards

    import smelt.preload

    assert guards.profile_guard_manager is smelt.preload._no_guard_profile
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * 2 + 1, backend="smelt")
    x = torch.randn(8, device=device)
    assert_close(compiled(x), x * 2 + 1)
    y = torch.randn(4, 3, device=device)  # a guard fails on the new rank: recompiled, not reused
    assert_close(compiled(y), y * 2 + 1)

    code = "import smelt, torch._dynamo.guards as g; print(g.profile_guard_manager.__module__)"
    env = {**os.environ, "SMELT_GUARD_PROFILE": "1"}
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "smelt" not in kept.stdout, kept.stdout + kept.stderr


def test_every_backend_the_settings_accept_is_registered():
    from smelt import config
    from smelt.codegen import backends
    assert set(backends.names()) == set(config.BACKENDS)
    for name in backends.names():
        backend = backends.named(name)
        assert backend.name == name and backend.devices
    assert backends.fallback().devices >= {"cpu", "cuda"}
