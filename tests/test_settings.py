"""SMELT_* environment variables: read in one place (smelt/config.py), one way per kind of value,
and refused with an error naming the variable and what it accepts."""
import logging
import os
import pathlib
import re

import pytest
import torch

from smelt import config
from smelt.config import BACKENDS, SETTINGS, Config, SettingError, setting

pytestmark = pytest.mark.cpu_backend_independent

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOLEANS = [name for name, s in SETTINGS.items() if s.parse is config.parse_bool]
INTEGERS = [name for name, s in SETTINGS.items() if s.parse is config.parse_positive_int]


@pytest.mark.parametrize("name", BOOLEANS)
@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("YES", True), ("On", True), (" yes ", True),
                                       ("0", False), ("false", False), ("False", False), ("no", False),
                                       ("OFF", False)])
def test_booleans_read_one_way(name, raw, value, monkeypatch):
    # SMELT_GRAPH_CACHE=false left the cache on; SMELT_AUTOTUNE=yes left autotuning off.
    monkeypatch.setenv(name, raw)
    assert setting(name) is value


@pytest.mark.parametrize("name", BOOLEANS)
def test_a_word_that_is_not_a_boolean_names_the_variable(name, monkeypatch):
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(SettingError, match=rf"{name}='maybe'.*1, true, yes, on.*0, false, no, off"):
        setting(name)


def test_config_fields_follow_their_variables(monkeypatch):
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "false")
    monkeypatch.setenv("SMELT_AUTOTUNE", "yes")
    monkeypatch.setenv("SMELT_SPLIT_REDUCTIONS", "off")
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", "128")
    cfg = Config()
    assert (cfg.graph_cache, cfg.autotune, cfg.split_reductions, cfg.persistent_reduction_limit) == \
        (False, True, False, 128)


@pytest.mark.parametrize("name", INTEGERS)
@pytest.mark.parametrize("raw", ["abc", "1.5", "0", "-4"])
def test_a_bad_integer_names_the_variable(name, raw, monkeypatch):
    monkeypatch.setenv(name, raw)
    with pytest.raises(SettingError, match=rf"{name}='{re.escape(raw)}'.*positive integer"):
        Config()


@pytest.mark.parametrize("name", ["SMELT_CPU_BACKEND", "SMELT_CUDA_BACKEND"])
def test_backend_names_are_checked(name, monkeypatch):
    monkeypatch.setenv(name, "halid")
    with pytest.raises(SettingError, match=rf"{name}='halid'.*accepted: {', '.join(BACKENDS)}"):
        Config()
    monkeypatch.setenv(name, "Triton")
    assert Config().backend_for("cpu" if "CPU" in name else "cuda") == "triton"


def test_an_empty_variable_means_its_default(monkeypatch):
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", "")
    monkeypatch.setenv("SMELT_DEBUG_DIR", "")
    assert Config().persistent_reduction_limit == 4096 and Config().debug_dir is None


def test_a_bad_setting_fails_the_compile_naming_it(monkeypatch):
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", "abc")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="SMELT_PERSISTENT_REDUCTION_LIMIT='abc'"):
        torch.compile(lambda x: x.sum(-1), backend="smelt")(torch.randn(4, 8))
    torch._dynamo.reset()


def test_an_unknown_variable_is_warned_about_once(monkeypatch, caplog):
    monkeypatch.setattr(config, "_warned_unknown", set())
    monkeypatch.setenv("SMELT_AUTOTUN", "1")
    with caplog.at_level(logging.WARNING, logger="smelt"):
        config.warn_unknown_variables()
        config.warn_unknown_variables()
    warnings = [r.getMessage() for r in caplog.records if "unknown environment variable" in r.getMessage()]
    assert len(warnings) == 1
    assert "SMELT_AUTOTUN (did you mean SMELT_AUTOTUNE?)" in warnings[0]
    assert all(name in warnings[0] for name in SETTINGS)


def test_every_variable_the_project_sets_or_reads_is_known():
    """A variable our own scripts, tools or Makefile use must not be warned about as a typo: the
    warning would teach users to ignore it."""
    root = pathlib.Path(__file__).resolve().parent.parent
    sources = [root / "Makefile", *root.glob("scripts/*"), *root.glob("smelt/**/*.py"),
               *root.glob("benchmarks/**/*.py"), root / "tests" / "conftest.py"]
    named = set()
    for path in sources:
        if path.is_file():
            # In Python a variable is named in a string; elsewhere (shell, make) by its bare word.
            quote = "[\"']" if path.suffix == ".py" else ""
            pattern = rf"{quote}\b(SMELT_[A-Z0-9_]*[A-Z0-9])\b{quote}"
            named |= set(re.findall(pattern, path.read_text(errors="replace")))
    markers = {"SMELT_STAGES"}  # a line prefix in compile_time's output, not a variable
    unknown = sorted(named - set(SETTINGS) - set(config.OUTSIDE_SMELT) - markers)
    assert not unknown, f"used by the project but warned about as unknown: {unknown}"


def test_known_variables_are_not_warned_about(monkeypatch, caplog):
    monkeypatch.setattr(config, "_warned_unknown", set())
    for name in SETTINGS:
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setenv("SMELT_TEST_DEVICE", os.environ.get("SMELT_TEST_DEVICE", "cpu"))
    with caplog.at_level(logging.WARNING, logger="smelt"):
        config.warn_unknown_variables()
    assert "unknown environment variable" not in caplog.text


# os.environ.get("SMELT_..."), os.getenv("SMELT_..."), os.environ["SMELT_..."] not assigned to
READ = re.compile(r"""(environ\.get|getenv)\(\s*["']SMELT_|environ\[\s*["']SMELT_\w+["']\s*\](?!\s*=[^=])""")


def test_only_config_reads_the_environment():
    # Each SMELT_* variable is parsed in one place: no other module of smelt reads one from os.environ.
    readers = []
    for folder, _, files in os.walk(os.path.join(REPO_ROOT, "smelt")):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != config.__file__:
                with open(path) as f:
                    if READ.search(f.read()):
                        readers.append(os.path.relpath(path, REPO_ROOT))
    assert readers == []


def test_the_readme_lists_every_setting_with_its_default():
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        readme = f.read()
    table = readme.split("## Settings (environment variables)")[1].split("\n## ")[0]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(SMELT_[A-Z0-9_]+)` \|.*$", table, re.M)}
    assert sorted(rows) == sorted(SETTINGS)
    for name, row in rows.items():
        assert row.count("|") >= 5, f"{name}: its row needs accepted values and a default"


def test_the_default_cache_dir_is_per_user(monkeypatch, tmp_path):
    # A fixed folder under the shared /tmp belonged to whoever compiled first: PermissionError for the others.
    monkeypatch.delenv("SMELT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert setting("SMELT_CACHE_DIR") == str(tmp_path / "xdg" / "smelt")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert setting("SMELT_CACHE_DIR") == str(tmp_path / "home" / ".cache" / "smelt")


def test_override_holds_settings_for_a_block_whatever_the_environment(monkeypatch):
    monkeypatch.setenv("SMELT_AUTOTUNE", "0")
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", "4096")
    with config.override(autotune=True, persistent_reduction_limit=64):
        assert config.current().autotune is True and config.current().persistent_reduction_limit == 64
        with config.override(persistent_reduction_limit="128"):  # checked as the variable's text is
            assert config.current().persistent_reduction_limit == 128 and config.current().autotune is True
        assert config.current().persistent_reduction_limit == 64
    assert config.current().autotune is False and config.current().persistent_reduction_limit == 4096


def test_override_names_what_it_refuses():
    with pytest.raises(SettingError, match="no such setting; accepted: .*autotune"):
        with config.override(autotun=True):
            pass
    with pytest.raises(SettingError, match="SMELT_CPU_BACKEND"):
        with config.override(cpu_backend="halid"):
            pass


@pytest.mark.smelt_only
def test_a_compile_inside_an_override_uses_it():
    import smelt.observe
    other = "triton" if config.current().cpu_backend != "triton" else "reference"
    smelt.observe.reset()
    x = torch.randn(8)
    with config.override(cpu_backend=other):
        torch.testing.assert_close(torch.compile(lambda t: t.sin() * 2, backend="smelt")(x), x.sin() * 2)
    (graph,) = smelt.observe.compiled_graphs()
    assert all(name.startswith(other) for name in graph.kernel_names), graph.kernel_names


@pytest.mark.smelt_only
def test_an_override_around_the_forward_holds_for_its_backward():
    # AOTAutograd compiles the backward at the first backward call: on CUDA on autograd's device
    # thread, which does not see the block's settings; here simply after the block ends.
    import smelt.observe
    other = "triton" if config.current().cpu_backend != "triton" else "reference"
    smelt.observe.reset()
    x = torch.randn(8, requires_grad=True)
    with config.override(cpu_backend=other):
        y = torch.compile(lambda t: (t.sin() * 2).sum(), backend="smelt")(x)
    y.backward()
    torch.testing.assert_close(x.grad, x.detach().cos() * 2)
    graphs = smelt.observe.compiled_graphs()
    assert len(graphs) == 2
    assert all(name.startswith(other) for g in graphs for name in g.kernel_names), [g.kernel_names for g in graphs]


def test_compile_workers_default_to_the_cores_this_process_may_use(monkeypatch):
    """Pinned by taskset or a container's cpuset, a process gets fewer cores than the machine has."""
    monkeypatch.delenv("SMELT_COMPILE_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5}, raising=False)
    assert setting("SMELT_COMPILE_WORKERS") == 2
