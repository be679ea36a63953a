"""The package's import graph is its architecture: no cycles, and no arrow from a lower layer up.

Every import of a swarmnode module counts, at module level or inside a function (a lazy import
still ties the two modules together). A layer may import its own layer and any layer below.
The process harness (``swarmnode.testing``) sits at the top; in the package only the launcher
(``swarmnode.tools.launch``) may use it. Outside the package, ``bench/`` and ``tests/`` share
code only through the package: neither imports (or runs as a module) the other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "swarmnode"
HARNESS = "swarmnode.testing"
#: The only modules outside the harness that may import it.
HARNESS_USERS = {"swarmnode.tools.launch"}

#: Bottom to top. A module belongs to the layer of the longest prefix listed here.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Shared primitives: errors, identities, config files, the node's home, sans-IO building blocks.
    (
        "base",
        (
            "swarmnode",
            "swarmnode.errors",
            "swarmnode.identity",
            "swarmnode.config",
            "swarmnode.home",
            "swarmnode.core",
        ),
    ),
    # Bytes and facts: the wire format, tasks and their scorers, files on disk, the operator surfaces.
    ("data", ("swarmnode.wire", "swarmnode.tasks", "swarmnode.store", "swarmnode.ops")),
    # The model: losses, policies, rollout engines, the trainer, the sandboxed verifier.
    (
        "model",
        ("swarmnode.learn", "swarmnode.policy", "swarmnode.rollout", "swarmnode.train", "swarmnode.verify"),
    ),
    # The boundary to peers: admission of their bytes, and the network itself.
    ("intake", ("swarmnode.admit", "swarmnode.net")),
    # One folder per protocol: a sans-IO core and the driver that does its I/O.
    ("protocols", ("swarmnode.gossip", "swarmnode.broadcast", "swarmnode.activation")),
    ("roles", ("swarmnode.roles",)),
    # Entry points: the command line, the simulator, developer and operator tools, and the process
    # harness of local swarms (the launcher, the tests and bench/ share it; the attacking peers).
    ("entry", ("swarmnode.cli", "swarmnode.sim", "swarmnode.tools", "swarmnode.testing")),
)


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str) -> Iterator[str]:
    """The swarmnode modules ``name`` imports (``from pkg import mod`` names ``pkg.mod``)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [
                f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names
            ]
        for target in targets:
            resolved = _resolve(target) if target.split(".")[0] == "swarmnode" else None
            if resolved is not None and resolved != name:
                yield resolved


GRAPH = {name: sorted(set(imports(name))) for name in MODULES}


def layer_of(name: str) -> int:
    best, layer = "", -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # The root package ("swarmnode": its version) is itself only, not everything below it.
            inside = name == prefix or (prefix != "swarmnode" and name.startswith(prefix + "."))
            if inside and len(prefix) > len(best):
                best, layer = prefix, index
    return layer


def cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in GRAPH:
        if root in index:
            continue
        work = [(root, iter(GRAPH[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(GRAPH[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_every_module_has_a_layer() -> None:
    assert [name for name in MODULES if layer_of(name) < 0] == []


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles() == []


def upward_arrows() -> list[str]:
    return [
        f"{name} ({LAYERS[layer_of(name)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
        for name, targets in GRAPH.items()
        for target in targets
        if layer_of(target) > layer_of(name)
    ]


def test_no_module_imports_from_a_higher_layer() -> None:
    assert upward_arrows() == []


def test_the_checker_sees_a_cycle_and_an_upward_arrow() -> None:
    # The checks above must be able to fail: a graph with both defects is caught.
    saved = dict(GRAPH)
    try:
        GRAPH["swarmnode.errors"] = ["swarmnode.roles.trainer"]
        GRAPH["swarmnode.roles.trainer"] = [*saved["swarmnode.roles.trainer"], "swarmnode.errors"]
        assert any("swarmnode.errors" in c for c in cycles())
        assert upward_arrows() == ["swarmnode.errors (base) -> swarmnode.roles.trainer (roles)"]
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def harness_importers() -> list[str]:
    """Modules outside the harness (and not allowed to) that import it."""
    return sorted(
        name
        for name, targets in GRAPH.items()
        if not (name == HARNESS or name.startswith(HARNESS + "."))
        and name not in HARNESS_USERS
        and any(t == HARNESS or t.startswith(HARNESS + ".") for t in targets)
    )


def test_only_the_launcher_imports_the_process_harness() -> None:
    assert harness_importers() == []


def test_the_harness_check_sees_a_forbidden_import() -> None:
    saved = GRAPH["swarmnode.cli"]
    try:
        GRAPH["swarmnode.cli"] = [*saved, "swarmnode.testing.swarm"]
        assert harness_importers() == ["swarmnode.cli"]
    finally:
        GRAPH["swarmnode.cli"] = saved


def references(source: str, top: str) -> list[str]:
    """Imports of package ``top`` in ``source``, and strings naming one of its modules (``-m top.x``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value:
            names = [node.value] if node.value.startswith(top + ".") else []
        found += [f"line {node.lineno}: {n}" for n in names if n == top or n.startswith(top + ".")]
    return found


def cross_references(folder: str, top: str) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} {ref}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
        for ref in references(path.read_text(), top)
    ]


def test_bench_does_not_import_tests() -> None:
    assert cross_references("bench", "tests") == []


def test_tests_do_not_import_bench() -> None:
    assert cross_references("tests", "bench") == []


def test_the_cross_check_sees_an_import_and_a_module_name() -> None:
    source = 'import os\nfrom tests.swarm import support\nargs = ["-m", "tests.fault.attacker"]\n'
    assert references(source, "tests") == ["line 2: tests.swarm", "line 3: tests.fault.attacker"]
    assert references("from bench.broadcast import CorruptingNode\n", "bench") == ["line 1: bench.broadcast"]
    assert references("x = 'tests.py passed'\n", "tests") == []
