"""The cache folder when things go wrong: damaged files are rebuilt, never loaded; a folder smelt
cannot write means compiling without the disk cache. What happens once per process (loading a
library, resolving the folder) is checked in fresh processes."""
import json
import logging
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from smelt import cache_location
from smelt.runtime import checked_files

pytestmark = pytest.mark.smelt_only

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, torch, smelt
    x = torch.linspace(-3, 3, 8 * 24).reshape(8, 24)
    fns = [lambda x: torch.softmax(x * 2, dim=-1), lambda x: (x.exp() + 1).sum(-1)]
    errors = [((torch.compile(f, backend="smelt")(x) - f(x)).abs() / (f(x).abs() + 1)).max().item() for f in fns]
    print(json.dumps(errors))
""")


def run_script(env: dict) -> tuple[list, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
               **env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as users run: Python would keep bytecode beside sources
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def cached_files(folder):
    """The files a compile reads back: libraries, sources and anything kept next to them."""
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and p.suffix not in (".lock", ".sha256") and "graphs" not in p.parts)


def test_a_damaged_cache_is_rebuilt_in_a_fresh_process(tmp_path):
    # A truncated Halide library killed the next process that loaded it (SIGBUS), until the folder was deleted.
    cache = tmp_path / "cache"
    env = {"SMELT_CACHE_DIR": str(cache), "SMELT_GRAPH_CACHE": "1"}
    errors, _ = run_script(env)
    assert max(errors) < 1e-5
    files = cached_files(cache)
    assert files
    for k, path in enumerate(files):  # graph entries have their own test (test_compile_cache)
        data = path.read_bytes()
        if k % 2:
            path.write_bytes(data[: len(data) // 2])  # truncated
        else:
            path.write_bytes(bytes((b * 7 + 13) % 256 for b in data))  # garbage of the same length
    errors, log = run_script(env)
    assert max(errors) < 1e-5
    assert "building it again" in log or "is damaged" in log
    for path in files:  # rebuilt whole
        if path.suffix == ".so":
            assert checked_files.problem(str(path)) is None
        elif path.suffix == ".py":
            compile(path.read_text(), str(path), "exec")


def test_an_unusable_cache_dir_compiles_without_the_disk_cache(tmp_path):
    # As root every folder is writable: a folder below a regular file is one nobody can create.
    (tmp_path / "a_file").write_text("")
    cache = tmp_path / "a_file" / "cache"
    errors, log = run_script({"SMELT_CACHE_DIR": str(cache), "SMELT_GRAPH_CACHE": "1"})
    assert max(errors) < 1e-5
    warnings = [line for line in log.splitlines() if "cannot use the cache folder" in line]
    assert len(warnings) == 1, log[-3000:]  # two graphs compiled, one warning
    assert str(cache) in warnings[0] and "SMELT_CACHE_DIR" in warnings[0]


def test_a_private_folder_replaces_an_unusable_one_with_the_graph_cache_off(tmp_path, monkeypatch, caplog):
    from smelt import config
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "1")
    with caplog.at_level(logging.WARNING, logger="smelt"):
        first, second = config.current(), config.current()
    assert first.cache_dir == second.cache_dir and os.path.isdir(first.cache_dir)
    assert not first.graph_cache
    assert stat.S_IMODE(os.stat(first.cache_dir).st_mode) == 0o700
    assert caplog.text.count("cannot use the cache folder") == 1


def test_a_new_cache_dir_is_private(tmp_path):
    folder = tmp_path / "new" / "smelt"
    assert cache_location.resolve(str(folder)) == (str(folder), True)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_checked_file_is_used_only_while_it_matches_its_hash(tmp_path, caplog):
    path = str(tmp_path / "lib.so")
    assert checked_files.problem(path) == checked_files.MISSING
    built = tmp_path / "built"
    built.write_bytes(b"\x7fELF whole library")
    checked_files.install(str(built), path)
    assert checked_files.problem(path) is None
    with open(path, "r+b") as f:  # damaged in place: same inode, same size
        f.write(b"garbage!")
    assert checked_files.problem(path) == "does not match its recorded hash"
    os.unlink(path + ".sha256")
    assert "no recorded hash" in checked_files.problem(path)
    with caplog.at_level(logging.WARNING, logger="smelt.runtime"):
        checked_files.discard(path, "is damaged")
    assert not os.path.exists(path) and path in caplog.text


def test_an_atomic_write_leaves_no_half_file(tmp_path, monkeypatch):
    path = tmp_path / "entry.json"
    checked_files.atomic_write(str(path), b"old")

    def crash(*args):
        raise KeyboardInterrupt  # the process stopped between writing and renaming

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        checked_files.atomic_write(str(path), b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["entry.json"]


def test_a_section_another_user_owns_makes_the_folder_unusable(tmp_path, monkeypatch):
    # The old shared default: the top folder writable, its `sources` made by another user with 0755.
    # Root writes anywhere, so the refusal is simulated where the probe writes.
    folder = tmp_path / "shared"
    (folder / "sources").mkdir(parents=True)
    real_mkstemp = cache_location.tempfile.mkstemp

    def mkstemp(dir=None, **kw):
        if dir == str(folder / "sources"):
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(dir=dir, **kw)

    monkeypatch.setattr(cache_location.tempfile, "mkstemp", mkstemp)
    private, persists = cache_location.resolve(str(folder))
    assert not persists and private != str(folder)


@pytest.mark.cpu_backend_independent
def test_a_new_cache_folder_gets_a_copy_of_the_runtime_this_process_holds(tmp_path, monkeypatch):
    """Halide's runtime depends only on what its folder's name spells: a second cache folder in the
    same process gets a copy of an intact one (1-1.5 s saved per folder), and a damaged one is never
    the source of a copy."""
    hl = pytest.importorskip("halide")
    from smelt.runtime import halide_compile
    builds = []
    real = hl.compile_standalone_runtime
    monkeypatch.setattr(hl, "compile_standalone_runtime", lambda *a: builds.append(a) or real(*a))
    first = halide_compile.runtime_library(str(tmp_path / "a"))
    second = halide_compile.runtime_library(str(tmp_path / "b"))
    assert second != first and len(builds) <= 1  # none if this process built one before the test
    with open(first, "rb") as f, open(second, "rb") as g:
        assert f.read() == g.read()
    assert checked_files.problem(second) is None
    with open(second, "r+b") as f:  # damaged after its install: the next folder's runtime is built
        f.seek(100)
        f.write(b"\0garbage\0")
    count = len(builds)
    third = halide_compile.runtime_library(str(tmp_path / "c"))
    assert len(builds) == count + 1 and checked_files.problem(third) is None
