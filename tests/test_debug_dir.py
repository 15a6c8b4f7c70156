"""SMELT_DEBUG_DIR: per-graph dump folders with the IR stages, wrapper and kernels."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.smelt_only

GRAPH_FILES = ("aten_graph.txt", "ir.txt", "fused_groups.txt", "wrapper.py")
HEADER_LINES = 10


def _subdirs(path):
    return sorted(p for p in path.iterdir() if p.is_dir())


def _aten_comment(text):
    """The '# aten ops: ...' style comment among the first lines of a kernel file, or None."""
    for line in text.splitlines()[:HEADER_LINES]:
        s = line.strip()
        if s.startswith("#") and "aten" in s.lower():
            return s
    return None


@pytest.fixture
def debug_dir(tmp_path, monkeypatch):
    d = tmp_path / "smelt_debug"
    d.mkdir()
    monkeypatch.setenv("SMELT_DEBUG_DIR", str(d))
    return d


def test_softmax_dump_has_graph_files_and_kernel_files(debug_dir, device, compile_fn, observe, assert_close):
    x = torch.randn(33, 129, device=device)
    fn = lambda x: F.softmax(x, dim=-1)  # noqa: E731
    assert_close(compile_fn(fn)(x), fn(x), atol=1e-5, rtol=1e-5)

    graphs = observe.compiled_graphs()
    subdirs = _subdirs(debug_dir)
    assert len(subdirs) == len(graphs) == 1, [p.name for p in subdirs]
    (folder,) = subdirs
    for name in GRAPH_FILES:
        f = folder / name
        assert f.is_file(), f"missing {name} in {folder}: {sorted(p.name for p in folder.iterdir())}"
        assert f.read_text().strip(), f"{name} is empty"

    kernel_names = graphs[0].kernel_names
    assert kernel_names
    for kname in kernel_names:
        kfile = folder / f"{kname}.py"
        assert kfile.is_file(), f"missing kernel file {kfile.name}"
        comment = _aten_comment(kfile.read_text())
        assert comment is not None, f"{kfile.name}: no aten-ops comment in the first {HEADER_LINES} lines"
        assert any(op in comment for op in ("exp", "softmax", "amax", "sum", "div")), comment


def test_kernel_file_matches_recorded_source(debug_dir, device, compile_fn, observe):
    x = torch.randn(17, 33, device=device)
    compile_fn(lambda x: (x.sin() * 2).sum(dim=-1))(x)
    (graph,) = observe.compiled_graphs()
    (folder,) = _subdirs(debug_dir)
    for kname, src in graph.kernel_sources.items():
        dumped = (folder / f"{kname}.py").read_text()
        assert src.strip() in dumped or dumped.strip() in src, f"{kname}.py differs from kernel_sources[{kname!r}]"
    wrapper = (folder / "wrapper.py").read_text()
    assert graph.wrapper_source.strip() in wrapper or wrapper.strip() in graph.wrapper_source


def test_aten_graph_dump_mentions_the_ops(debug_dir, device, compile_fn, observe):
    x = torch.randn(17, 33, device=device)
    compile_fn(lambda x: torch.tanh(x) + x.amax(dim=0))(x)
    (folder,) = _subdirs(debug_dir)
    text = (folder / "aten_graph.txt").read_text()
    assert "tanh" in text and "amax" in text


def test_one_folder_per_compiled_graph_in_training(debug_dir, device, compile_fn, observe):
    lin = torch.nn.Linear(33, 9).to(device)
    x = torch.randn(17, 33, device=device)
    compile_fn(lambda x: torch.softmax(lin(x), dim=-1).sum())(x).backward()
    kinds = [g.kind for g in observe.compiled_graphs()]
    assert "forward" in kinds and "backward" in kinds
    subdirs = _subdirs(debug_dir)
    assert len(subdirs) == len(kinds)
    for folder in subdirs:
        for name in GRAPH_FILES:
            assert (folder / name).is_file(), f"missing {name} in {folder.name}"


def test_no_dump_without_env(tmp_path, monkeypatch, device, compile_fn, observe):
    monkeypatch.delenv("SMELT_DEBUG_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    x = torch.randn(17, 33, device=device)
    compile_fn(lambda x: x.exp() + 1)(x)
    assert not any(p.name.endswith(("aten_graph.txt", "fused_groups.txt")) for p in tmp_path.rglob("*"))
