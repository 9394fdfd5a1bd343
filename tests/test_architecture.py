"""The package's layers point one way: the order is written down once (`LAYERS`) and enforced here.

The import graph is read from source with `ast` (nothing is imported), so these tests are fast and need no torch.
docs/architecture.md describes the layers; this file is the one place they are enforced.
"""

from __future__ import annotations

import ast
import collections
import re
import textwrap
from pathlib import Path

import pytest

PACKAGE = "sagegen"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

# Bottom layer first. A module may import from its own layer and the layers below it, never from a layer above.
# A module belongs to the layer of its longest matching prefix ("a.b" matches "a.b" and "a.b.<anything>");
# the package root ("sagegen", no dot) matches only itself: its __init__.py, not the whole package.
LAYERS: list[tuple[str, ...]] = [
    ("sagegen.config", "sagegen.models"),
    ("sagegen.kernels",),
    ("sagegen.sparse", "sagegen.linear", "sagegen.runs"),
    ("sagegen.api", "sagegen.eval"),
    ("sagegen.parallel", "sagegen.report", "sagegen.testing"),
    ("sagegen.backend",),
    ("sagegen.patch", "sagegen"),
    ("sagegen.jobs",),
    ("sagegen.cli",),
    ("sagegen.__main__",),
]

MAX_LOOSE_MODULES = 5  # .py files directly in sagegen/
SHARED_FILE_NAMES = {"__init__.py", "__main__.py"}  # the only file names that may repeat

Arrow = tuple[str, str, int]  # (imported module, file, line)
Graph = dict[str, list[Arrow]]  # module -> the package modules it imports


# --- parsing: source files -> import graph -------------------------------------------------------------------

def module_files(folder: Path, package: str) -> dict[str, Path]:
    """Every module of the package in `folder`: dotted name -> file (a package is its __init__.py)."""
    modules = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([package, *parts])] = path
    return modules


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _existing(name: str, modules: set[str]) -> str:
    """`name`, or its longest prefix that is a module (`sagegen.x.attr` -> `sagegen.x`)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str | None:
    """The absolute name `from <level dots><name> import ...` refers to inside `module`; None above the root."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 >= len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _table_strings(node: ast.AST) -> list[ast.Constant]:
    """String constants that are direct entries of a dict (keys and values) or a tuple."""
    if isinstance(node, ast.Dict):
        entries = [*node.keys, *node.values]
    elif isinstance(node, ast.Tuple):
        entries = node.elts
    else:
        return []
    return [e for e in entries if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def imports_of(source: str, module: str, is_package: bool, package: str, modules: set[str],
               file: str = "<string>") -> list[Arrow]:
    """The package modules that `module` (source text) imports, wherever the import statement is.

    Counted: `import` and `from ... import` (absolute or relative; `from x import y` is `x.y` when that is a
    module, else `x`), at any depth (functions, classes, if/try, TYPE_CHECKING); `[importlib.]import_module(
    "<package>.x")` with a constant name; and dict/tuple entries that are the full name of a module of the
    package (lazy tables such as `{"sageattn": "sagegen.api"}` or `("sagegen.patch.families.ltx_call", "f")`).
    """
    tree = ast.parse(source, filename=file)
    arrows: list[Arrow] = []

    def add(name: str | None, line: int) -> None:
        if name and _in_package(name, package):
            arrow = (_existing(name, modules), file, line)
            if arrow not in arrows:  # `from x import a, b` is one arrow
                arrows.append(arrow)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module if node.level == 0 else _resolve_relative(module, is_package, node.level, node.module)
            if base is None:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in modules else base, node.lineno)
        elif isinstance(node, ast.Call) and _call_name(node.func) == "import_module" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if first.value.startswith(package + "."):
                    add(first.value, node.lineno)
        for const in _table_strings(node):
            if const.value in modules and const.value.startswith(package + ".") and const.value != module:
                add(const.value, const.lineno)
    return arrows


def build_graph(folder: Path, package: str) -> Graph:
    """{module: [(imported module, file, line)]} for the package in `folder`; files named relative to its parent."""
    files = module_files(folder, package)
    modules = set(files)
    graph: Graph = {}
    for name, path in files.items():
        rel = path.relative_to(folder.parent).as_posix()
        graph[name] = imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", package,
                                 modules, rel)
    return graph


# --- checks: pure functions over a graph ----------------------------------------------------------------------

def layer_of(module: str, layers: list[tuple[str, ...]]) -> int | None:
    """Index (0 = bottom) of the layer of the longest prefix matching `module`; None if none matches."""
    best, best_len = None, -1
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            exact_only = "." not in prefix  # the package root: its __init__ only
            if module == prefix or (not exact_only and module.startswith(prefix + ".")):
                if len(prefix) > best_len:
                    best, best_len = index, len(prefix)
    return best


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components of the graph (iterative; nodes outside the graph are ignored)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    successors = {m: sorted({dst for dst, _, _ in arrows if dst in graph}) for m, arrows in graph.items()}

    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(successors[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _path_around(graph: Graph, members: list[str]) -> list[Arrow]:
    """One cycle through the component's first module, as arrows (shortest, by breadth-first search)."""
    inside, start = set(members), members[0]
    came_from: dict[str, tuple[str, Arrow]] = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for arrow in graph[node]:
            dst = arrow[0]
            if dst == start:
                path = [arrow]
                while node != start:
                    node, step = came_from[node]
                    path.append(step)
                return path[::-1]
            if dst in inside and dst not in came_from:
                came_from[dst] = (node, arrow)
                queue.append(dst)
    return []


def find_circles(graph: Graph) -> list[tuple[list[str], list[Arrow]]]:
    """Import circles: each component of more than one module, or a module importing itself, with a path around."""
    circles = []
    for members in strongly_connected(graph):
        if len(members) > 1 or any(dst == members[0] for dst, _, _ in graph[members[0]]):
            circles.append((members, _path_around(graph, members)))
    return circles


def upward_imports(graph: Graph, layers: list[tuple[str, ...]]) -> list[tuple[str, str, int, str]]:
    """(module, file, line, imported module) for every arrow from a layer to a higher one."""
    found = []
    for module, arrows in sorted(graph.items()):
        here = layer_of(module, layers)
        for dst, file, line in arrows:
            there = layer_of(dst, layers)
            if here is not None and there is not None and there > here:
                found.append((module, file, line, dst))
    return found


def unplaced_modules(graph: Graph, layers: list[tuple[str, ...]]) -> list[str]:
    return sorted(m for m in graph if layer_of(m, layers) is None)


def describe_circles(circles: list[tuple[list[str], list[Arrow]]]) -> str:
    lines = []
    for members, path in circles:
        lines.append(f"circle of {len(members)} module(s): {', '.join(members)}")
        src = members[0]
        for dst, file, line in path:
            lines.append(f"    {src} -> {dst}  ({file}:{line})")
            src = dst
    return "\n".join(lines)


def describe_upward(found: list[tuple[str, str, int, str]], layers: list[tuple[str, ...]]) -> str:
    return "\n".join(f"{file}:{line}: {module} (layer {layer_of(module, layers) + 1}) imports {dst} "
                     f"(layer {layer_of(dst, layers) + 1})" for module, file, line, dst in found)


def loose_modules(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.py"))


def repeated_file_names(folder: Path) -> dict[str, list[str]]:
    seen = collections.defaultdict(list)
    for path in sorted(folder.rglob("*.py")):
        if path.name not in SHARED_FILE_NAMES:
            seen[path.name].append(path.relative_to(folder.parent).as_posix())
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


# --- the real package -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(PACKAGE_DIR, PACKAGE)


def test_every_module_has_a_layer(graph):
    missing = unplaced_modules(graph, LAYERS)
    assert not missing, "modules in no layer (add them to LAYERS in tests/test_architecture.py):\n" + "\n".join(
        missing)


def test_no_import_circles(graph):
    circles = find_circles(graph)
    assert not circles, "import circles:\n" + describe_circles(circles)


def test_no_upward_imports(graph):
    found = upward_imports(graph, LAYERS)
    assert not found, f"{len(found)} import(s) from a lower layer to a higher one:\n" + describe_upward(found, LAYERS)


def test_few_loose_top_level_modules():
    loose = loose_modules(PACKAGE_DIR)
    assert len(loose) <= MAX_LOOSE_MODULES, f"{len(loose)} loose modules in {PACKAGE}/ (at most " \
        f"{MAX_LOOSE_MODULES}): {', '.join(loose)}"


def test_no_repeated_module_file_names():
    repeated = repeated_file_names(PACKAGE_DIR)
    assert not repeated, "file names used more than once:\n" + "\n".join(
        f"{name}: {', '.join(paths)}" for name, paths in sorted(repeated.items()))


# Rooms that work on tensors and files only: the kernels (and what sits beside them) know nothing of diffusers.
NO_DIFFUSERS = ("sagegen.config", "sagegen.kernels", "sagegen.linear", "sagegen.sparse", "sagegen.runs",
                "sagegen.api", "sagegen.eval", "sagegen.parallel", "sagegen.report")


def third_party_imports(source: str) -> set[str]:
    """Top-level names of every module `source` imports, at any depth (functions, if/try blocks)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_lower_rooms_import_no_diffusers():
    files = module_files(PACKAGE_DIR, PACKAGE)
    offenders = sorted(f"{name} ({path.relative_to(PACKAGE_DIR.parent)})" for name, path in files.items()
                       if any(name == room or name.startswith(room + ".") for room in NO_DIFFUSERS)
                       and "diffusers" in third_party_imports(path.read_text(encoding="utf-8")))
    assert not offenders, f"these modules import diffusers: {offenders}"


def test_the_diffusers_check_sees_nested_imports():
    assert "diffusers" in third_party_imports("def f():\n    if True:\n        from diffusers.hooks import X\n")
    assert "diffusers" not in third_party_imports("import torch\nfrom sagegen.kernels import spec\n")


def test_graph_sees_the_lazy_tables(graph):
    """The lazy name tables count as imports (otherwise the root's layer would be checked on too little)."""
    targets = {dst for dst, _, _ in graph[PACKAGE]}
    assert {"sagegen.api", "sagegen.config", "sagegen.patch"} <= targets


# --- test the test: small fake packages -----------------------------------------------------------------------

FAKE_LAYERS: list[tuple[str, ...]] = [("pkg.low",), ("pkg.mid", "pkg"), ("pkg.top",)]


def fake_graph(tmp_path: Path, files: dict[str, str]) -> Graph:
    """Write `files` ({"low/a.py": source}) as package `pkg` under tmp_path (every folder a package) and parse it."""
    root = tmp_path / "pkg"
    for rel, source in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in [path.parent, *path.parent.parents]:
            if folder == tmp_path:
                break
            (folder / "__init__.py").touch()
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return build_graph(root, "pkg")


CLEAN = {
    "low/a.py": "import os\n",
    "low/b.py": "from pkg.low import a\n",
    "mid/c.py": """
        from typing import TYPE_CHECKING
        from pkg.low.b import something
        from ..low import a
        if TYPE_CHECKING:
            from pkg.low import b
        def later():
            import importlib
            return importlib.import_module("pkg.low.a")
        """,
    "top/d.py": "from pkg.mid import c\nTABLE = {'x': 'pkg.mid.c'}\nPAIR = ('pkg.low.b', 'name')\n",
}


def test_fake_clean_package_passes(tmp_path):
    graph = fake_graph(tmp_path, CLEAN)
    assert find_circles(graph) == []
    assert upward_imports(graph, FAKE_LAYERS) == []
    assert unplaced_modules(graph, FAKE_LAYERS) == []
    assert sorted(dst for dst, _, _ in graph["pkg.mid.c"]) == ["pkg.low.a", "pkg.low.a", "pkg.low.b", "pkg.low.b"]
    assert sorted(dst for dst, _, _ in graph["pkg.top.d"]) == ["pkg.low.b", "pkg.mid.c", "pkg.mid.c"]


CIRCLES = {
    "top-level imports": {"mid/a.py": "from pkg.mid import b\n", "mid/b.py": "import pkg.mid.a\n"},
    "function-level imports": {
        "mid/a.py": "def f():\n    from pkg.mid.b import g\n",
        "mid/b.py": "class C:\n    def m(self):\n        from pkg.mid import a\n",
    },
    "import_module string": {
        "mid/a.py": "import importlib\ndef f():\n    return importlib.import_module('pkg.mid.b')\n",
        "mid/b.py": "from importlib import import_module\nMOD = import_module('pkg.mid.a')\n",
    },
    "relative imports": {"mid/a.py": "from . import b\n", "mid/b.py": "from .a import name\n"},
    "lazy table": {"mid/a.py": "_LAZY = {'thing': 'pkg.mid.b'}\n", "mid/b.py": "from pkg.mid.a import thing\n"},
}


@pytest.mark.parametrize("files", CIRCLES.values(), ids=CIRCLES.keys())
def test_fake_circle_is_found(tmp_path, files):
    circles = find_circles(fake_graph(tmp_path, files))
    assert [members for members, _ in circles] == [["pkg.mid.a", "pkg.mid.b"]]
    message = describe_circles(circles)
    assert "pkg.mid.a -> pkg.mid.b" in message and "pkg.mid.b -> pkg.mid.a" in message
    assert re.search(r"pkg/mid/[ab]\.py:\d+", message)


def test_fake_self_import_is_a_circle(tmp_path):
    circles = find_circles(fake_graph(tmp_path, {"mid/a.py": "def f():\n    import pkg.mid.a\n"}))
    assert [members for members, _ in circles] == [["pkg.mid.a"]]


def test_fake_longer_circle_has_a_path_around(tmp_path):
    files = {"low/a.py": "import pkg.low.b\n", "low/b.py": "import pkg.low.c\n", "low/c.py": "import pkg.low.a\n"}
    (members, path), = find_circles(fake_graph(tmp_path, files))
    assert members == ["pkg.low.a", "pkg.low.b", "pkg.low.c"]
    assert [dst for dst, _, _ in path] == ["pkg.low.b", "pkg.low.c", "pkg.low.a"]


UPWARD = {
    "absolute": ("low/a.py", "import os\n\nfrom pkg.top.t import x\n", 3, "pkg.top.t"),
    "relative": ("low/a.py", "from ..top import t\n", 1, "pkg.top.t"),
    "function-level": ("low/a.py", "def f():\n    import pkg.top.t\n", 2, "pkg.top.t"),
    "import_module string": ("low/a.py", "import importlib\nT = importlib.import_module('pkg.top')\n", 2, "pkg.top"),
    "into the root": ("low/a.py", "from pkg import helper\n", 1, "pkg"),
}


@pytest.mark.parametrize("rel, source, line, target", UPWARD.values(), ids=UPWARD.keys())
def test_fake_upward_import_is_found(tmp_path, rel, source, line, target):
    graph = fake_graph(tmp_path, {rel: source, "top/t.py": "from pkg.low import a\n"})
    found = upward_imports(graph, FAKE_LAYERS)
    assert found == [("pkg.low.a", "pkg/low/a.py", line, target)]
    assert f"pkg/low/a.py:{line}: pkg.low.a (layer 1) imports {target}" in describe_upward(found, FAKE_LAYERS)


def test_fake_module_without_layer_is_named(tmp_path):
    graph = fake_graph(tmp_path, {"other/x.py": "", "low/a.py": ""})
    assert unplaced_modules(graph, FAKE_LAYERS) == ["pkg.other", "pkg.other.x"]


@pytest.mark.parametrize("module, layer", [("pkg", 1), ("pkg.mid", 1), ("pkg.mid.x.y", 1), ("pkg.top", 2),
                                           ("pkg.lowish", None), ("pkg.other", None)])
def test_layer_of_longest_prefix(module, layer):
    assert layer_of(module, FAKE_LAYERS) == layer


def test_fake_repeated_names_and_loose_modules(tmp_path):
    fake_graph(tmp_path, {"low/util.py": "", "top/util.py": "", "one.py": "", "two.py": ""})
    assert repeated_file_names(tmp_path / "pkg") == {"util.py": ["pkg/low/util.py", "pkg/top/util.py"]}
    assert loose_modules(tmp_path / "pkg") == ["__init__.py", "one.py", "two.py"]
