"""No module or class of smelt or of its tests defines one name twice: the second definition silently
replaces the first for every caller, the earlier ones included (a box's `_reads_memory` replaced by a
node's of the same name crashed every CUDA graph holding a CPU scalar, a path no CPU test takes), and a
test defined twice runs once."""
import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _redefinitions(body, where: str) -> list[str]:
    seen, found = {}, []
    for node in body:
        if isinstance(node, ast.ClassDef):
            found += _redefinitions(node.body, f"{where}.{node.name}")
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        # A property's setter and typing's overloads reuse the name on purpose.
        if any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter") or ast.unparse(d).endswith("overload")
               for d in node.decorator_list):
            continue
        if node.name in seen and node.name != "_":  # `_`: a registration kept by its decorator
            found.append(f"{where}: {node.name} at lines {seen[node.name]} and {node.lineno}")
        seen[node.name] = node.lineno
    return found


def test_no_name_is_defined_twice_in_one_scope():
    found = []
    for top in ("smelt", "tests", "benchmarks", "scripts"):
        for folder, _, files in os.walk(os.path.join(REPO, top)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    found += _redefinitions(ast.parse(open(path).read()).body, os.path.relpath(path, REPO))
    assert not found, "names defined twice:\n" + "\n".join(found)
