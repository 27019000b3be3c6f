"""The house plan, checked from the imports of src/toollatch (docs/ARCHITECTURE.md).

Every module lives in a room; rooms are stacked in layers and a module imports only its own
room and the layers below it. No import circle between modules, and across rooms only
public names: a room with a package of its own (runtime, ledger, mcp, relay, scripted, cli)
is used through that package, never through its ``_private`` modules, except for a name whose
public home is ``toollatch`` itself (``Agent``, ``open_ledger``...: the package does not export
it, and no room imports the root), which is imported from its module; the base rooms (core,
tools) have no public face of their own, so the rooms above use their modules, but never a
``_private`` name in them. Every import counts: at the top, in a function (lazy) and under
``TYPE_CHECKING``. Each allowed exception is listed below with its reason.
(tests/ and benchmarks/ may import private modules: they are not rooms.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = "toollatch"

# Bottom to top. A room may import rooms of lower layers only (not one of its own layer).
LAYERS: list[list[str]] = [
    ["core"],  # sans-IO: decoders, adapters, assembler, gate, preview, rounds, messages...
    ["stages", "testing"],  # toollatch.stages (the core's stages), toollatch.testing
    ["tools", "ledger", "scripted"],  # pure tools; the durable ledger; the scripted server
    ["runtime", "mcp"],  # the agent loop, dispatcher, model clients; MCP tool sources
    ["relay"],  # the web relay (Starlette app, runs, guard, server)
    ["cli"],  # the application: the command line, its subcommands, the whole-app config
    ["root"],  # toollatch/__init__.py re-exports from every room
]
ROOMS_WITH_PACKAGE = {"runtime", "ledger", "mcp", "relay", "scripted", "cli"}
"""Used through their package; core and tools (base rooms) through their modules."""


def _root_names() -> frozenset[str]:
    tree = ast.parse((SRC / PKG / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    raise AssertionError("toollatch/__init__.py has no __all__")


ROOT_NAMES = _root_names()
"""The names whose public home is ``toollatch``: imported from their own module, since the
package of their room does not export them (each public name has one home)."""

# (importing module, imported module): reason. Upward imports allowed on purpose.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("toollatch.runtime", "toollatch.cli._app_config"): (
        "toollatch.runtime.Config / load_config / CONFIG_EXAMPLE stay importable (public "
        "before the application layer existed); resolved lazily in __getattr__ (and for "
        "type checkers), so importing the runtime imports nothing of the application"
    ),
}
# (importing module, imported module or room package): reason. Another room's private module
# or name; a room package (e.g. "toollatch.runtime") covers any module of that room.
ALLOWED_PRIVATE: dict[tuple[str, str], str] = {
    ("toollatch.runtime._dispatch_round", "toollatch.ledger._context"): (
        "the dispatcher sets the running call's context (set_current / reset_current) and its "
        "idempotency key: the ledger's hooks for its one driver, not user API"
    ),
    ("toollatch.runtime._ledger_run", "toollatch.ledger._context"): (
        "the same hooks: the idempotency key of a claimed call"
    ),
    ("toollatch.runtime._ledger_run", "toollatch.ledger._records"): (
        "FINAL, the ledger's set of final states, which the claim-and-run guard checks"
    ),
    ("toollatch.relay._http", "toollatch.runtime._clients._http"): (
        "stream_http: the relay's runs and the proxy's upstream read model streams on the same "
        "client as the model clients' shared pool (aiohttp's transport, the environment's "
        "proxy, no cookie): one builder, not user API"
    ),
    ("toollatch.relay._server", "toollatch.scripted._server"): (
        "http_implementation: the relay serves on the same quiet uvicorn settings as the "
        "scripted server it embeds"
    ),
    ("toollatch.relay._proxy", "toollatch.scripted._server"): (
        "http_implementation: the proxy serves on the relay's uvicorn settings too"
    ),
    ("toollatch.runtime", "toollatch.cli._app_config"): (
        "the lazy compatibility import of ALLOWED_UPWARD (the config is not a name of the "
        "toollatch.cli package)"
    ),
    ("toollatch.relay._app", "toollatch.runtime._resume"): (
        "file_interrupted: a survivor stores what a dead worker's run recorded of its "
        "interrupted round beside its history (the agent loop's own record, read back by "
        "its one reader: the relay's lease sweep), not user API"
    ),
    ("toollatch.cli._app_config", "toollatch.mcp._servers"): (
        "unique_names: the config names its MCP servers by mcp's own rule (derived names get "
        "_2, _3...), as the --mcp specs are"
    ),
    ("toollatch.cli._app_config", "toollatch.runtime"): (
        "DEFAULT_DEADLINE_S (from whichever runtime module defines it): the config's documented "
        "default run deadline is the runtime's own"
    ),
    ("toollatch.cli._serve_command", "toollatch.relay._server"): (
        "settle_heap: `toollatch serve` settles the heap once before serving (a process-level "
        "step of the command, not relay API)"
    ),
    ("toollatch.cli._proxy", "toollatch.relay._server"): (
        "settle_heap: `toollatch proxy` settles the heap once before serving, as `toollatch "
        "serve` does (a process-level step of the command, not relay API)"
    ),
}
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}
"""Circles allowed on purpose (none). An ALLOWED_UPWARD edge is a known back-edge: the
circle it closes is that exception, so it is left out of the circle search."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {
    module_name(p): p for p in sorted((SRC / PKG).rglob("*.py")) if "__pycache__" not in p.parts
}


def room(module: str) -> str:
    parts = module.split(".")
    if module == PKG:
        return "root"
    if parts[1] in {"core", "tools", "ledger", "scripted", "runtime", "mcp", "relay", "cli"}:
        return parts[1]
    if len(parts) == 2 and parts[1] in {"stages", "testing"}:
        return parts[1]
    return "?"


def layer(room_name: str) -> int:
    return next(i for i, rooms in enumerate(LAYERS) if room_name in rooms)


def imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import in ``module``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: list[tuple[str, list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith(PKG)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == PKG or target.startswith(PKG + ".")):
                continue
            names = []
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:  # `from package import module`
                    out.append((f"{target}.{alias.name}", [], node.lineno))
                else:
                    names.append(alias.name)
            if names or not node.names:
                out.append((target, names, node.lineno))
    return out


GRAPH: dict[str, list[tuple[str, list[str], int]]] = {m: imports(m) for m in MODULES}


def allowed(table: dict[tuple[str, str], str], importer: str, target: str) -> bool:
    return any(m == importer and (target == t or target.startswith(t + ".")) for m, t in table)


def nearest_module(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_every_module_is_in_a_room():
    assert [m for m in MODULES if room(m) == "?"] == []
    assert {room(m) for m in MODULES} <= {r for rs in LAYERS for r in rs}


def test_no_import_circles():
    edges = {
        m: {nearest_module(t) for t, _, _ in GRAPH[m]}
        - {m}
        - {t for (f, t) in ALLOWED_UPWARD if f == m}
        for m in MODULES
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[frozenset[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                circles.append(frozenset(scc))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    wrong = [" <-> ".join(sorted(c)) for c in circles if c not in ALLOWED_CIRCLES]
    assert not wrong, "import circles:\n" + "\n".join(wrong)


def test_rooms_import_downward_only():
    wrong = []
    for m, targets in GRAPH.items():
        for raw, _, line in targets:
            t = nearest_module(raw)
            a, b = room(m), room(t)
            if a == b or (m, t) in ALLOWED_UPWARD:
                continue
            if layer(b) >= layer(a):
                wrong.append(
                    f"{m}:{line} ({a}, layer {layer(a)}) imports {t} ({b}, layer {layer(b)})"
                )
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_no_private_names_of_other_rooms():
    wrong = []
    for m, targets in GRAPH.items():
        for raw, names, line in targets:
            t = nearest_module(raw)
            a, b = room(m), room(t)
            if a == b or allowed(ALLOWED_PRIVATE, m, t):
                continue
            private_names = [n for n in names if n.startswith("_")]
            if private_names:
                wrong.append(f"{m}:{line} imports private {private_names} from {t}")
            homed_at_root = bool(names) and set(names) <= ROOT_NAMES
            if b in ROOMS_WITH_PACKAGE and t != f"{PKG}.{b}" and not homed_at_root:
                wrong.append(f"{m}:{line} imports {t}: use the {PKG}.{b} package's names")
    assert not wrong, "private names of another room:\n" + "\n".join(wrong)


def test_allowed_exceptions_are_still_needed():
    """An exception that no import needs any more goes from the lists."""
    seen = {(m, nearest_module(t)) for m, ts in GRAPH.items() for t, _, _ in ts}
    stale = [
        k
        for table in (ALLOWED_UPWARD, ALLOWED_PRIVATE)
        for k in table
        if not any(allowed({k: ""}, m, t) for m, t in seen)
    ]
    assert not stale, f"exceptions no import needs: {stale}"


@pytest.mark.parametrize("module", ["core", "tools"])
def test_base_rooms_do_no_io(module):
    """The core is sans-IO: no asyncio, threads, clocks, randomness, logging, sockets, HTTP
    or databases, anywhere in it. The tools open no sockets or databases (a tool's call is
    awaitable and may run in the tool threads: asyncio, threading and logging are theirs)."""
    forbidden = {"socket", "ssl", "httpx", "starlette", "uvicorn", "aiohttp", "sqlite3", "redis"}
    if module == "core":
        forbidden |= {"asyncio", "threading", "time", "datetime", "random", "logging"}
    wrong = []
    for m, path in MODULES.items():
        if room(m) != module:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module.split(".")[0]]
            wrong += [f"{m}:{node.lineno}: {n}" for n in names if n in forbidden]
    assert not wrong, "I/O in a base room:\n" + "\n".join(wrong)
