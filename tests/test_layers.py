"""The package's layers, read from its imports (``docs/architecture.md``, "Layers"):
imports point down only, there is no cycle, and no module or function outgrows
what a reader can hold (the replay and the CLI, a separate concern, excepted).

Floors, bottom up: the array primitives (``flatradix/kernels/``), the component
rules (``flatradix/components/``), the tree core (``flatradix/core/``), then the
engine and everything above it.
"""

import ast
from pathlib import Path

import flatradix

ROOT = Path(flatradix.__file__).parent
#: each floor may import only floors at or below it
FLOORS = {"kernels": 0, "components": 1, "core": 2}
MAX_MODULE_LINES = 1000
MAX_FUNCTION_LINES = 200
#: the replay and the CLI are their own concern (restructured apart)
EXCEPT = ("replay", "cli.py")
#: modules over the size limit, each with why (to be split by its owner)
OVERSIZE = {}


def _modules():
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        yield ("flatradix." + ".".join(rel.with_suffix("").parts)).removesuffix(".__init__"), f


def _imports(name, path):
    """The flatradix modules ``name`` imports (relative imports resolved)."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("flatradix"))
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("flatradix"):
                continue
            for a in node.names:  # "from . import x" names a module
                sub = f"{mod}.{a.name}"
                out.add(sub if (ROOT.parent / (sub.replace(".", "/") + ".py")).exists()
                        or (ROOT.parent / sub.replace(".", "/")).is_dir() else mod)
    return out


def _floor(mod):
    parts = mod.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 2 else None


def test_imports_point_down_only():
    bad = []
    for name, path in _modules():
        mine = _floor(name)
        if mine is None:
            continue
        for dep in _imports(name, path):
            theirs = _floor(dep)
            if theirs is None or theirs > mine:
                bad.append(f"{name} -> {dep}")
    assert not bad, "imports above their floor: " + ", ".join(sorted(bad))


def test_no_import_cycle():
    graph = {name: {d for d in _imports(name, path) if d != name} for name, path in _modules()}
    graph = {k: {d for d in v if d in graph} for k, v in graph.items()}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            # a package importing its own submodules (``__init__``) is not a cycle
            if len(comp) > 1 and not all(c.startswith(min(comp, key=len)) for c in comp):
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_module_and_function_sizes():
    too_long = []
    for name, path in _modules():
        rel = path.relative_to(ROOT)
        if rel.parts[0] in EXCEPT:
            continue
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES and rel.as_posix() not in OVERSIZE:
            too_long.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{rel}: {node.name} {n} lines")
    assert not too_long, too_long
