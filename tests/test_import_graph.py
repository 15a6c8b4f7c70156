"""The shape of smelt's imports: no cycle between modules (function-level imports included, since
they only hide one), and packages import downward only, in the order below."""
import ast
import collections
import os

import pytest

from smelt.backend_registry import BACKENDS

pytestmark = pytest.mark.cpu_backend_independent

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "smelt")

# Each group may import itself and the groups before it. The runtime sits low: it reads what code
# generation left only through smelt.artifact, so the launch side of a feature lives in runtime/.
# Every backend's package (codegen/<name>/), as the registry names them.
BACKEND_PACKAGES = sorted({entry.codegen.rsplit(".", 1)[0] for entry in BACKENDS.values()})
LAYERS = [
    {"smelt.errors", "smelt.backend_registry", "smelt.symbolic", "smelt.source_digest", "smelt.cache_location",
     "smelt.debug", "smelt.artifact", "smelt.target", "smelt.progress"},
    {"smelt.runtime"},
    {"smelt.config", "smelt.observe", "smelt.preload", "smelt.compile_stages", "smelt.precompile"},
    {"smelt.graph_cache"},
    {"smelt.ir"},
    {"smelt.lowering", "smelt.scheduler", "smelt.decompositions", "smelt.saved_inputs"},
    {"smelt.codegen"},
    set(BACKEND_PACKAGES),
    {"smelt.pipeline"},
    {"smelt.backend"},
    {"smelt", "smelt.cli", "smelt.__main__", "smelt.tools", "smelt.report"},
]
# Backends are peers: none imports another.
PEERS = [(a, b) for a in BACKEND_PACKAGES for b in BACKEND_PACKAGES if a != b]


def _modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, os.path.dirname(ROOT))[:-3].split(os.sep)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(modules) -> dict[str, set[str]]:
    graph = collections.defaultdict(set)
    for module, path in modules.items():
        tree = ast.parse(open(path).read())
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        hidden = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If)
                  and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != module:
                    graph[module].add(target)
    return graph


def _group(module: str) -> str:
    parts = module.split(".")
    if ".".join(parts[:3]) in BACKEND_PACKAGES:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def _cycle(graph) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


@pytest.fixture(scope="module")
def graph():
    return _imports(_modules())


def test_no_import_cycle(graph):
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_packages_import_downward(graph):
    level = {}
    for k, layer in enumerate(LAYERS):
        for name in layer:
            level[name] = k
    upward = []
    for module, targets in graph.items():
        for target in targets:
            a, b = _group(module), _group(target)
            if a not in level or b not in level:
                upward.append(f"{module} -> {target} (a package the test's LAYERS do not place)")
            elif a != b and level[b] > level[a]:
                upward.append(f"{module} -> {target}")
            elif (a, b) in PEERS or (b, a) in PEERS:
                upward.append(f"{module} -> {target} (backends are peers)")
    assert not upward, "imports against the layering:\n" + "\n".join(sorted(upward))
