"""The house rules docs/architecture.md describes, held by the code itself: the layers import what
they may, no module imports another that imports it back (unless the import is lazy and says why),
and modules and functions stay small enough to read in one sitting."""
from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests import paths

PACKAGES = ("engine", "explorer")
MAX_ROOT_MODULES = 12
MAX_LINES = 400
LONG_FUNCTION = 60
MAX_LONG_FUNCTIONS = 5
LAZY_CYCLE = "lazy cycle:"  # the comment an import that closes a cycle carries, with its reason
LONG_REASON = "long:"  # the comment above (or on) a function's def that says why it is long


def _modules() -> dict[str, ast.Module]:
    out = {}
    for package in PACKAGES:
        for path in sorted((paths.ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(paths.ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path, lazy: bool) -> dict[str, int]:
    """The first-party modules `name` imports (module-level only unless `lazy`), with a line of each;
    an import whose line says `lazy cycle:` is left out (it is allowed to close a cycle)."""
    source = path.read_text()
    lines = source.splitlines()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, node):
        if LAZY_CYCLE in lines[node.lineno - 1] or LAZY_CYCLE in lines[node.end_lineno - 1]:
            return
        if target in MODULES and target != name and not name.startswith(target + "."):
            found.setdefault(target, node.lineno)

    def visit(body, in_function: bool):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if lazy:
                    visit(node.body, True)
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                add(module, node)
                for alias in node.names:
                    add(f"{module}.{alias.name}", node)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit([n for n in inner if isinstance(n, ast.stmt)] + [
                        s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body], in_function)

    visit(ast.parse(source).body, False)
    return found


def _cycles(lazy: bool) -> list[list[str]]:
    graph = {name: _imports(name, path, lazy) for name, path in MODULES.items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            connect(v)
    return [[f"{a} -> {b} (line {graph[a][b]})" for a in c for b in graph[a] if b in c] for c in found]


@pytest.mark.parametrize("lazy", [False, True], ids=["module-level", "with-lazy"])
def test_no_import_circles(lazy):
    cycles = _cycles(lazy)
    assert not cycles, f"import circles (mark a deliberate lazy one with '# {LAZY_CYCLE} why'): {cycles}"


def test_the_file_layer_and_the_selection_import_no_torch():
    code = ("import sys, json\n"
            "import engine.modelfile.index, engine.modelfile.reader, engine.modelfile.writer\n"
            "import engine.modelfile.weights, engine.modelfile.protowire, engine.modelfile.text\n"
            "import engine.gradient.selection, engine.gradient.differentiable, engine.gradient.feed_syntax\n"
            "graph = engine.modelfile.reader.read_graph('sample_models/mlp.onnx')\n"
            "spec = engine.gradient.selection.validate(graph, 'loss', ['W1'], ['X', 'T'])\n"
            "print(json.dumps(sorted(m for m in ('torch', 'textual') if m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=paths.ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_engine_root_holds_few_modules():
    root = sorted(p.name for p in (paths.ROOT / "engine").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"engine/ holds {len(root)} modules: {root}"


def test_no_module_over_400_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these before they pass {MAX_LINES} lines: {long}"


def test_long_functions_are_few_and_say_why():
    long, unexplained = [], []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > LONG_FUNCTION:
                    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    long.append(f"{name}.{node.name} ({size})")
                    if not any(LONG_REASON in lines[i] for i in (first - 2, node.lineno - 1) if i >= 0):
                        unexplained.append(long[-1])
    assert len(long) <= MAX_LONG_FUNCTIONS, f"{len(long)} functions over {LONG_FUNCTION} lines: {long}"
    assert not unexplained, f"say why with a '# {LONG_REASON} ...' line above the def: {unexplained}"


def test_the_engine_never_imports_the_ui():
    """Textual and the explorer never; Rich only for the command line's console output (engine/cli)."""
    offenders = []
    for name, path in MODULES.items():
        if not name.startswith("engine"):
            continue
        banned = ("textual", "explorer") if name.startswith("engine.cli") else ("textual", "explorer", "rich")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported = [node.module or ""]
            else:
                continue
            offenders += [f"{name}: {m}" for m in imported if m.split(".")[0] in banned]
    assert not offenders, f"engine modules importing the UI: {offenders}"
