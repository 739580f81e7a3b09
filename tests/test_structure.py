"""The shape of the code, read with `ast` only (nothing is imported, no model is needed).

- No import cycle among the modules of server/, slots/ and cache/. Every import counts:
  at module level, inside a function, or under `if TYPE_CHECKING:` (a cycle dodged by a
  late import is still a cycle in the design).
- No module in those folders is over 500 lines, declarative tables (`TABLES`) excepted.
- Imports run down: server -> slots -> cache. Inside server/, an API (api/, routes/) may
  import the pipeline and the core, the pipeline only the core, and the core neither:
  what the core needs of an API (errors, stores, metrics, schemas), the API registers.
  The composition root (`COMPOSITION_ROOT`: the app and the process that builds it) wires
  everything and may import anything.
- server/ uses no private (underscore) name of another module, and imports the engine
  through the package `warmslot.slots` only, never through one of its submodules.
- The disk store uses no private name of the disk format.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("server", "slots", "cache")  # installed as warmslot.<folder>
MAX_LINES = 500
# Declarative tables: data laid out one row a line, exempt from the size limit.
TABLES = {"warmslot.server.process.flags"}
# The modules that assemble the server from its parts.
COMPOSITION_ROOT = {"warmslot.server.app", "warmslot.server.__main__", "warmslot.server.process.cli"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module it imports (one of ours)
    names: tuple[str, ...]  # the names taken from it (empty for `import x`)
    source: str  # the module path written in the import, dots resolved against the importer
    line: int
    raw: str  # the import as written


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "warmslot." + ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {
        _module_name(path): path
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


MODULES = _modules()


def _package_of(module: str) -> str:
    """The package that relative imports in `module` start from."""
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package_of(module).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _ours(name: str) -> str | None:
    """The deepest module of ours that `name` names or lies in (None: not ours)."""
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return None


def _imports(module: str) -> list[Import]:
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _ours(alias.name)
                if target is not None:
                    found.append(Import(module, target, (), alias.name, node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            names = tuple(alias.name for alias in node.names)
            raw = ast.unparse(node)
            submodules = [f"{source}.{name}" for name in names if f"{source}.{name}" in MODULES]
            for sub in submodules:  # `from package import submodule`
                found.append(Import(module, sub, (), source, node.lineno, raw))
            rest = tuple(name for name in names if f"{source}.{name}" not in MODULES)
            target = _ours(source)
            if target is not None and (rest or not submodules):
                found.append(Import(module, target, rest, source, node.lineno, raw))
    return found


IMPORTS = {module: _imports(module) for module in MODULES}


def _where(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself)."""
    graph = {m: sorted({i.target for i in IMPORTS[m]}) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:  # Tarjan; the graph is a few hundred nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
            if len(component) > 1 or v in graph[v]:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _describe_cycle(component: list[str]) -> str:
    members = set(component)
    edges = [
        f"    {_where(i.module)}:{i.line}: {i.raw}"
        for m in component for i in IMPORTS[m] if i.target in members
    ]
    return " <-> ".join(component) + "\n" + "\n".join(edges)


def test_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "import cycles (every import counts, late and TYPE_CHECKING ones too):\n" + "\n".join(
        _describe_cycle(c) for c in cycles
    )


def test_no_module_over_500_lines():
    long = {
        _where(m): n
        for m, path in MODULES.items()
        if m not in TABLES and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: " + ", ".join(f"{p} ({n})" for p, n in sorted(long.items()))


def _server_imports() -> list[Import]:
    return [i for m in MODULES if m.startswith("warmslot.server") for i in IMPORTS[m]]


def test_server_imports_no_private_names():
    offenders = [
        f"{_where(i.module)}:{i.line}: {i.raw}"
        for i in _server_imports()
        if i.target != i.module and any(name.startswith("_") for name in i.names)
    ]
    # `from . import _module` names a private module
    offenders += [
        f"{_where(i.module)}:{i.line}: {i.raw}"
        for i in _server_imports()
        if not i.names and i.target.rsplit(".", 1)[-1].startswith("_") and not i.target.endswith("__init__")
    ]
    assert not offenders, "server/ imports private names of other modules:\n" + "\n".join(sorted(set(offenders)))


def test_server_imports_the_engine_through_its_package():
    offenders = [
        f"{_where(i.module)}:{i.line}: {i.raw}"
        for i in _server_imports()
        if i.source.startswith("warmslot.slots.")
    ]
    assert not offenders, "server/ imports through submodules of warmslot.slots (import from warmslot.slots):\n" + "\n".join(
        sorted(set(offenders))
    )


def _layer(module: str) -> tuple[str, int]:
    """(the part of the tree, its height): an import may only go to the same or a lower height."""
    if module.startswith("warmslot.cache"):
        return "cache", 0
    if module.startswith("warmslot.slots"):
        return "slots", 1
    if module in COMPOSITION_ROOT:
        return "server: composition root", 5
    for prefix, name, height in (
        ("warmslot.server.api", "server: api", 4),
        ("warmslot.server.routes", "server: api", 4),
        ("warmslot.server.pipeline", "server: pipeline", 3),
    ):
        if module == prefix or module.startswith(prefix + "."):
            return name, height
    return "server: core", 2


def test_imports_only_run_down():
    """server -> slots -> cache; inside server/, api -> pipeline -> core."""
    offenders = [
        f"{_where(i.module)}:{i.line}: {i.raw}   ({_layer(i.module)[0]} -> {_layer(i.target)[0]})"
        for m in MODULES
        for i in IMPORTS[m]
        if _layer(i.target)[1] > _layer(m)[1]
        # a package's __init__ naming its own submodules is not an import upward
        and not i.target.startswith(m + ".")
    ]
    assert not offenders, "imports that climb:\n" + "\n".join(sorted(set(offenders)))


def test_the_layers_are_read():
    assert _layer("warmslot.server.api.chat.route")[1] > _layer("warmslot.server.pipeline.sse")[1]
    assert _layer("warmslot.server.pipeline.sse")[1] > _layer("warmslot.server.errors")[1]
    assert _layer("warmslot.server.errors")[1] > _layer("warmslot.slots.engine")[1] > _layer("warmslot.cache.prompt_cache")[1]
    assert any(_layer(i.target)[0] == "server: pipeline" for i in IMPORTS["warmslot.server.api.chat.route"])


# the disk store's modules: its index and API, its writer thread, its directory
DISK_STORE = ("warmslot.cache.disk.store", "warmslot.cache.disk.writer", "warmslot.cache.disk.directory")


@pytest.mark.parametrize("store", DISK_STORE)
def test_disk_store_uses_no_private_name_of_the_format(store):
    fmt = "warmslot.cache.disk.format"
    offenders = [f"line {i.line}: {i.raw}" for i in IMPORTS[store] if i.target == fmt and any(n.startswith("_") for n in i.names)]
    tree = ast.parse(MODULES[store].read_text())
    aliases = set()  # the names the format module is bound to in the store
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _resolve(store, node) == "warmslot.cache.disk":
            aliases |= {a.asname or a.name for a in node.names if a.name == "format"}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == fmt and a.asname}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name) and node.value.id in aliases
        ):
            offenders.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    assert not offenders, f"{_where(store)} uses private names of cache/disk/format.py:\n" + "\n".join(offenders)


def test_the_checks_see_the_code():
    """The checks above pass vacuously if they read nothing: make sure they read the tree."""
    assert "warmslot.slots.engine" in MODULES and "warmslot.server" in MODULES
    assert any(i.target == "warmslot.slots.engine" for i in IMPORTS["warmslot.slots"])
    relative = [i for i in IMPORTS["warmslot.cache.disk.index"] if i.target == "warmslot.cache.prefix_trie"]
    assert relative, "`from ..prefix_trie import ...` must resolve"
