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
- slots/llama_api/, the one ctypes seam, imports no module of ours outside itself: the engine
  depends on the seam, never the other way.
- A module in a sub-package of slots/ imports no module of the slots/ root, but the few data
  types every floor shares (`ROOT_DATA`): the root is the top, its sub-packages lie below it.
- slots/ and cache/ assign no callable onto another object after it is built: a part gets
  what it calls in its constructor.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
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


SEAM = "warmslot.slots.llama_api"


def test_llama_api_imports_nothing_of_the_engine():
    offenders = [
        f"{_where(i.module)}:{i.line}: {i.raw}"
        for m in MODULES if m == SEAM or m.startswith(SEAM + ".")
        for i in IMPORTS[m]
        if not (i.target == SEAM or i.target.startswith(SEAM + "."))
    ]
    assert not offenders, "slots/llama_api/ imports modules outside itself (pass plain values, or types it defines):\n" + "\n".join(
        sorted(set(offenders))
    )


# -- slots/'s sub-packages import nothing of its root ------------------------------------------
# The root of slots/ is the top of the engine: its one import surface (__init__.py) and the
# tools over a whole Engine (crash_report.py, slot_files.py). Its sub-packages (engine/, step/,
# reuse/, sampling/, speculation/, multimodal/, fitting/, llama_api/) lie below it and import
# down or across, never back up, but for these modules, which the root keeps because every
# floor reads them and they import nothing of the engine's parts:
SLOTS = "warmslot.slots"
ROOT_DATA = {
    f"{SLOTS}.requests": "the messages between threads: GenerateRequest, Event, Reuse, the errors",
    f"{SLOTS}.settings": "EngineConfig, the settings every part that loads or sizes something reads",
    f"{SLOTS}.stats": "EngineStats, the counters every part adds to (it imports nothing)",
    f"{SLOTS}.slot": "Slot and Active: what a sequence holds and the request it serves, read by "
    "the step, the tiers, the router and the drafters alike",
    f"{SLOTS}.vocab": "Vocab, the vocabulary both sides use: the HTTP side tokenizes with it, the "
    "loader builds it on the model (it imports only llama_api)",
}


def _in_slots_root(module: str) -> bool:
    return module == SLOTS or (module.startswith(SLOTS + ".") and module.count(".") == 2 and MODULES[module].name != "__init__.py")


def _in_slots_subpackage(module: str) -> bool:
    return module.startswith(SLOTS + ".") and not _in_slots_root(module)


def test_slots_subpackages_import_nothing_of_the_root():
    offenders = [
        f"{_where(i.module)}:{i.line}: {i.raw}"
        for m in MODULES if _in_slots_subpackage(m)
        for i in IMPORTS[m]
        if _in_slots_root(i.target) and i.target not in ROOT_DATA
    ]
    assert not offenders, (
        "a sub-package of slots/ imports the root (move what it needs down, or pass it in):\n"
        + "\n".join(sorted(set(offenders))))


def _slots_package(module: str) -> str | None:
    """The sub-package of slots/ that `module` lies in (engine, step, reuse, ...), else None."""
    return module.split(".")[2] if _in_slots_subpackage(module) else None


def test_slots_subpackages_depend_one_way():
    """Between the sub-packages too the imports run one way: no two of them import each other,
    directly or through others (the root's data aside, which lies outside them)."""
    graph: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for m in MODULES:
        a = _slots_package(m)
        for i in IMPORTS[m] if a else ():
            b = _slots_package(i.target)
            if b and b != a:
                graph.setdefault(a, set()).add(b)
                why.setdefault((a, b), f"{_where(m)}:{i.line}: {i.raw}")

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for n in graph.get(todo.pop(), ()):
                if n == goal:
                    return True
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return False

    both = sorted(f"{a} -> {b} ({why[a, b]}) and back" for a in graph for b in graph[a] if reaches(b, a))
    assert not both, "sub-packages of slots/ that depend on each other:\n" + "\n".join(both)
    assert "step" in graph["engine"] and "reuse" in graph["step"]  # the check reads the tree


def test_the_root_check_sees_the_tree():
    """The check above reads the root and its sub-packages as they are: data it may take names
    modules of the root, and it sees sub-packages' imports of one another."""
    for module in ROOT_DATA:
        assert _in_slots_root(module), module
    assert _in_slots_root(SLOTS) and not _in_slots_root(f"{SLOTS}.engine")
    assert _in_slots_subpackage(f"{SLOTS}.step.outbox") and _in_slots_subpackage(f"{SLOTS}.reuse.tiers.base")
    assert any(i.target == f"{SLOTS}.reuse.memory" for i in IMPORTS[f"{SLOTS}.step.media_prefill"])
    assert any(i.target == f"{SLOTS}.slot" for i in IMPORTS[f"{SLOTS}.step.media_prefill"])


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
    assert any(i.target == "warmslot.slots.llama_api.model" for i in IMPORTS["warmslot.slots.llama_api.context"])


# -- no callable is assigned onto another object after construction --------------------------
# A part is given what it calls in its constructor (a collaborator, or a protocol such as
# warmslot.cache.demand.Demand), so that what calls what can be read where things are built.
HOOK_FOLDERS = ("slots", "cache")


def _methods() -> set[str]:
    """The names of the methods (not properties) that classes in slots/ and cache/ define, but
    those that some class also has as data (a field, or `self.name = ...`)."""
    names, data = set(), set()
    for m, path in MODULES.items():
        if m.split(".")[1] not in HOOK_FOLDERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not any(
                        isinstance(d, ast.Name) and d.id in ("property", "staticmethod") or isinstance(d, ast.Attribute)
                        for d in item.decorator_list
                    ):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        data.add(item.target.id)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                data |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return names - data


def _callable_names(scope: ast.AST) -> set[str]:
    """Names that `scope` (a module or a function) binds to a function: a def, a lambda, a partial."""
    names = set()
    for node in ast.walk(scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not scope:
            names.add(node.name)
        elif isinstance(node, ast.Assign) and _is_function(node.value, set(), set()):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _factories(tree: ast.Module) -> set[str]:
    """The module's functions that return a function (a lambda or a partial)."""
    return {
        f"{node.name}()" for node in tree.body if isinstance(node, ast.FunctionDef)
        and any(isinstance(r, ast.Return) and r.value is not None and _is_function(r.value, set(), set()) for r in ast.walk(node))
    }


def _is_function(value: ast.AST, methods: set[str], local: set[str]) -> bool:
    if isinstance(value, ast.IfExp):
        return _is_function(value.body, methods, local) or _is_function(value.orelse, methods, local)
    if isinstance(value, ast.BoolOp):
        return any(_is_function(v, methods, local) for v in value.values)
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Call):  # functools.partial(...), partial(...)
        fn = value.func
        return (isinstance(fn, ast.Name) and (fn.id == "partial" or f"{fn.id}()" in local)) or (
            isinstance(fn, ast.Attribute) and fn.attr == "partial")
    if isinstance(value, ast.Name):
        return value.id in local
    # a bound method: obj.method
    return isinstance(value, ast.Attribute) and value.attr in methods


def _hooks_assigned() -> list[str]:
    methods = _methods()
    found = []
    for m, path in MODULES.items():
        if m.split(".")[1] not in HOOK_FOLDERS:
            continue
        tree = ast.parse(path.read_text())
        module_names = _callable_names(tree) | _factories(tree)
        scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope in scopes:
            local = module_names | (_callable_names(scope) if scope is not tree else set())
            body = scope.body
            for node in (n for stmt in body for n in ast.walk(stmt)):
                if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                hooked = [
                    t for t in flat
                    if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"))
                    # `x.on_... = anything but None`, or a function of any name
                    and (t.attr.startswith("on_") and not (isinstance(node.value, ast.Constant) and node.value.value is None)
                         or _is_function(node.value, methods, local))
                ]
                found += [f"{_where(m)}:{node.lineno}: {ast.unparse(node)}" for _ in hooked[:1]]
    return sorted(set(found))


def test_no_callable_is_assigned_onto_another_object():
    """slots/ and cache/ give a part what it calls when they build it; none assigns a function
    (a lambda, a partial, a bound method, a def) onto another object afterwards."""
    found = _hooks_assigned()
    assert not found, "callables assigned onto other objects after construction (pass them to the constructor):\n" + "\n".join(found)


def test_the_hook_check_sees_hooks():
    tree = ast.parse("def f(cache, engine):\n    cache.on_over = lambda: engine.call(cache.trim)\n    cache.parse = partial(parse, x=1)\n")
    fn = tree.body[0]
    assign = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)]
    assert all(_is_function(a.value, set(), set()) for a in assign)
    assert _is_function(ast.parse("x.y = self.spill").body[0].value, {"spill"}, set())
    assert _is_function(ast.parse("cache.parse = _parser(kind)").body[0].value, set(), {"_parser()"})
    assert not _is_function(ast.parse("slot.tenant = req.tenant").body[0].value, _methods(), set())
