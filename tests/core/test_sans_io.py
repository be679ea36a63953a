"""The sans-IO rule, checked on the source: cores import nothing that does I/O, reads a clock or runs a loop.

DESIGN.md principle 1 and STYLE.md "Sans-IO cores": protocol logic is plain state machines with no
sockets, no clocks and no event loop; inputs are events and a ``now``, outputs are actions. The modules
held to it are the ones documented that way (README's architecture table, each package's docstring):

- each protocol's ``core.py`` (``swarmnode/*/core.py``) and every module under ``swarmnode/core/`` (globbed,
  so a new core is checked the day it lands);
- every other module of a protocol folder (``gossip/``, ``broadcast/``, ``activation/``) but the ones that
  do its I/O (``PROTOCOL_WITH_IO``: the drivers, the weight publisher/receiver and the installing of
  versions into a model, the offers' DHT records):
  e.g. the rules between the gossip core and admission that the driver and the simulator share
  (``gossip/intake.py``, ``gossip/records.py``) and the worker's weight receiver (``broadcast/receiver.py``),
  also globbed; unlike a core they may import the layers below them (admission, the wire format);
- ``swarmnode/admit/``, but ``intake.py`` (the admission thread, the one admit module that may read a clock)
  and ``recompute.py`` (the torch half of spot checks);
- ``swarmnode/learn/`` (pure torch losses that "must not run models, read files or talk to peers"), held
  to the I/O, clock and loop rules only: torch is its subject and ``random.Random`` its callers' seeded rng.

Every import counts, inside functions too, and ``__import__`` / ``importlib.import_module`` calls with a
literal name. Names are compared in full (``from swarmnode import net`` is ``swarmnode.net``), a forbidden
name also forbidding everything below it (``time`` forbids ``time.monotonic``, not ``timeit``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "swarmnode"

#: What no sans-IO module may import, by what it would bring in.
IO_CLOCKS_AND_LOOPS = (
    # event loops, threads, processes, signals
    "asyncio", "trio", "anyio", "threading", "_thread", "concurrent", "multiprocessing", "subprocess",
    "signal", "selectors",
    # sockets and network libraries
    "socket", "ssl", "http", "urllib", "aiohttp", "hivemind", "grpc",
    # clocks
    "time", "datetime",
    # files and the operating system
    "os", "io", "pathlib", "shutil", "tempfile", "sqlite3",
    # imports by a name computed at run time, which this check could not see
    "importlib",
    # the package's drivers and other layers that do I/O
    "swarmnode.net", "swarmnode.sim", "swarmnode.roles", "swarmnode.gossip.driver",
    "swarmnode.broadcast.driver", "swarmnode.broadcast.weights", "swarmnode.broadcast.adapter",
    "swarmnode.activation.records",
    "swarmnode.activation.offers", "swarmnode.store", "swarmnode.ops", "swarmnode.tools",
    "swarmnode.verify.pool", "swarmnode.verify.worker", "swarmnode.admit.intake",
)  # fmt: skip
#: ... and what a protocol core or admission may not import either: hidden randomness (the caller seeds
#: any choice), torch (no model runs in a core).
STATE_AND_MODELS = ("random", "secrets", "torch", "numpy")
#: The only parts of the package a protocol core may import: the shared building blocks and the errors;
#: the cores sit below swarmnode.wire and every other layer.
CORE_MAY_IMPORT = ("swarmnode.core", "swarmnode.errors")


#: Admission modules that are not sans-IO: the admission thread, and the torch half of spot checks.
ADMIT_WITH_IO = ("intake.py", "recompute.py")
#: The modules of each protocol folder that do its I/O; every other module there is sans-IO.
PROTOCOL_WITH_IO = {
    "gossip": ("driver.py",),
    # weights: the asyncio publisher/receiver over torch; adapter: installs versions into a torch model
    "broadcast": ("driver.py", "weights.py", "adapter.py"),
    "activation": ("records.py",),  # the DHT reads and writes of offers
}


def protocol_cores() -> list[Path]:
    """Each protocol folder's ``core.py`` and the shared building blocks under ``swarmnode/core/``."""
    return sorted([*PACKAGE.glob("*/core.py"), *(PACKAGE / "core").rglob("*.py")])


def modules() -> Iterator[tuple[Path, tuple[str, ...]]]:
    """(path, forbidden names) for every module held to the rule."""
    protocol = IO_CLOCKS_AND_LOOPS + STATE_AND_MODELS
    cores = protocol_cores()
    for path in cores:
        yield path, protocol
    for folder, with_io in PROTOCOL_WITH_IO.items():
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            if path.name not in with_io and path not in cores:
                yield path, protocol
    for path in sorted((PACKAGE / "admit").rglob("*.py")):
        if path.name not in ADMIT_WITH_IO:
            yield path, protocol
    for path in sorted((PACKAGE / "learn").rglob("*.py")):
        yield path, IO_CLOCKS_AND_LOOPS


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, full module name) of every import in ``path``, at any depth."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from swarmnode import net`` imports swarmnode.net; a rule on ``base`` matches as a prefix.
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and _called(node.func) in ("__import__", "import_module"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def _called(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def matches(name: str, rules: tuple[str, ...]) -> str | None:
    return next((rule for rule in rules if name == rule or name.startswith(rule + ".")), None)


CHECKED = list(modules())


def test_the_guard_sees_every_core_module_and_the_other_sans_io_packages() -> None:
    checked = {path.relative_to(PACKAGE.parent).as_posix() for path, _ in CHECKED}
    on_disk = {p.relative_to(PACKAGE.parent).as_posix() for p in (PACKAGE / "core").rglob("*.py")}
    cores = {f"swarmnode/{protocol}/core.py" for protocol in ("gossip", "broadcast", "activation")}
    assert on_disk <= checked and cores <= checked
    assert {"swarmnode/admit/pipeline.py", "swarmnode/admit/spotcheck.py"} <= checked
    assert "swarmnode/learn/hacpo.py" in checked
    assert "swarmnode/admit/intake.py" not in checked
    assert {"swarmnode/gossip/intake.py", "swarmnode/gossip/records.py"} <= checked
    assert {"swarmnode/broadcast/receiver.py", "swarmnode/activation/offers.py"} <= checked
    assert "swarmnode/gossip/driver.py" not in checked and "swarmnode/broadcast/weights.py" not in checked


@pytest.mark.parametrize(
    ("path", "forbidden"), CHECKED, ids=[path.relative_to(PACKAGE.parent).as_posix() for path, _ in CHECKED]
)
def test_a_sans_io_module_imports_nothing_that_does_io_reads_a_clock_or_runs_an_event_loop(
    path: Path, forbidden: tuple[str, ...]
) -> None:
    found = [
        f"{module_name(path)} (line {line}) imports {name} (forbidden: {rule})"
        for line, name in imports(path)
        if (rule := matches(name, forbidden)) is not None
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "path",
    protocol_cores(),
    ids=lambda path: path.relative_to(PACKAGE.parent).as_posix(),
)
def test_a_core_imports_from_the_package_only_other_cores_and_its_errors(path: Path) -> None:
    allowed = " and ".join(CORE_MAY_IMPORT)
    found = [
        f"{module_name(path)} (line {line}) imports {name} (a core may import only {allowed})"
        for line, name in imports(path)
        if matches(name, ("swarmnode",)) and not matches(name, CORE_MAY_IMPORT)
    ]
    assert not found, "\n".join(found)
