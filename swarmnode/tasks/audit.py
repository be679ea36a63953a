"""Audit reasoning-gym scorers: which ones can run, or choke on, the text they are given.

Owns: a static walk of each family's ``score_answer`` call graph through
reasoning-gym's source, naming every unsafe construct it reaches. Must not:
call a scorer on hostile text (the dynamic probes in
``tests/verify/test_probes.py`` do that, inside the sandbox).

What counts as unsafe (each is a way a peer's answer has hurt a node):

- ``eval``, ``exec``, ``compile``, ``__import__``: the answer runs as code
  (binary_matrix ran ``open('pwned', 'w')``);
- ``pickle`` / ``marshal`` / ``dill`` loads: the same, through a byte format;
- ``sympy`` ``sympify`` / ``parse_expr``: they ``eval`` their input;
- recursion: a function of the scorer's call graph that can call itself,
  where nesting in the answer becomes stack depth (propositional_logic
  raised ``RecursionError`` at 3,500 parentheses);
- ``fractions.Fraction`` on text: it builds the exact integer an exponent
  names (coin_flip's ``float(Fraction(answer))`` spent 6.8 s of CPU on
  ``1e10000000``, red team rt24). ``Decimal`` keeps the exponent apart and
  ``int()`` refuses over 4,300 digits, so they are left to the probes.

The walk over-approximates on purpose: a method called on an unknown object is
followed into every class of the same module that defines that name, and a
construct counts wherever it is reached, whether it touches the answer or the
task's own data (``number_sorting`` ``eval``s its own answer key: flagged all the
same; a reviewer can see the line in the finding). Super-linear work that is
not recursion is left to the dynamic probes and to the sandbox's CPU limit.
"""

from __future__ import annotations

import ast
import builtins
import fractions
import inspect
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from swarmnode.tasks.safe_scorers import SAFE_SCORER_NOTES

_CODE_BUILTINS = {"eval", "exec", "compile", "__import__"}
#: (module prefix, attribute) pairs that deserialize or evaluate their input.
_CODE_FUNCTIONS = {
    ("pickle", "loads"),
    ("pickle", "load"),
    ("_pickle", "loads"),
    ("_pickle", "load"),
    ("marshal", "loads"),
    ("dill", "loads"),
    ("sympy", "sympify"),
    ("sympy", "parse_expr"),
    ("sympy", "eval_expr"),
    ("sympy", "S"),
}
_UPSTREAM = "reasoning_gym"
MAX_FUNCTIONS = 400  # a scorer's call graph is a few dozen functions; this bounds a runaway walk


@dataclass(frozen=True)
class Finding:
    """What the audit found for one family: unsafe constructs, each as ``construct (where)``."""

    family: str
    unsafe: tuple[str, ...]
    functions: int  # functions walked

    @property
    def safe(self) -> bool:
        return not self.unsafe


@dataclass
class _Walk:
    unsafe: list[str] = field(default_factory=list)
    edges: dict[str, set[str]] = field(default_factory=dict)
    functions: dict[str, types.FunctionType] = field(default_factory=dict)


def _qualname(fn: types.FunctionType) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _as_function(obj: Any) -> types.FunctionType | None:
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, types.FunctionType) and (obj.__module__ or "").startswith(_UPSTREAM):
        return obj
    return None


def _class_functions(cls: type, name: str) -> list[types.FunctionType]:
    for klass in cls.__mro__:
        if name in vars(klass):
            fn = _as_function(vars(klass)[name])
            return [fn] if fn is not None else []
    return []


def _module_classes(module_name: str) -> Iterator[type]:
    module = __import__(module_name, fromlist=["_"])
    for value in vars(module).values():
        if isinstance(value, type) and value.__module__ == module_name:
            yield value


def _code_construct(obj: Any) -> str | None:
    """``obj``'s name when calling it evaluates or deserializes its argument."""
    if obj is None:
        return None
    if obj in (builtins.eval, builtins.exec, builtins.compile, builtins.__import__):
        return str(obj.__name__)
    if obj is fractions.Fraction:
        return "fractions.Fraction"
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__name__", "")
    for prefix, attribute in _CODE_FUNCTIONS:
        if (module == prefix or module.startswith(prefix + ".")) and name == attribute:
            return f"{prefix}.{attribute}"
    return None


def _resolve(node: ast.expr, fn: types.FunctionType, owner: type | None) -> list[Any]:
    """What a call target may be: objects (functions, classes, modules' attributes) or []."""
    scope = {**vars(builtins), **fn.__globals__}
    if isinstance(node, ast.Name):
        return [scope[node.id]] if node.id in scope else []
    if not isinstance(node, ast.Attribute):
        return []
    base = node.value
    if isinstance(base, ast.Name) and base.id in ("self", "cls") and owner is not None:
        return list(_class_functions(owner, node.attr))
    if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
        return list(_class_functions(owner, node.attr)) if owner is not None else []
    if isinstance(base, ast.Name) and base.id in scope:
        target = scope[base.id]
        if isinstance(target, types.ModuleType | type):
            value = getattr(target, node.attr, None)
            return [value] if value is not None else []
    # A method on an object of unknown type: every same-module class defining that name.
    found: list[Any] = []
    for klass in _module_classes(fn.__module__):
        found.extend(_class_functions(klass, node.attr))
    return found


def _owner_of(fn: types.FunctionType) -> type | None:
    parts = fn.__qualname__.split(".")
    if len(parts) < 2:
        return None
    module = __import__(fn.__module__, fromlist=["_"])
    owner = getattr(module, parts[0], None)
    return owner if isinstance(owner, type) else None


def _walk(fn: types.FunctionType, walk: _Walk, owner: type | None) -> None:
    name = _qualname(fn)
    if name in walk.functions or len(walk.functions) >= MAX_FUNCTIONS:
        return
    walk.functions[name] = fn
    walk.edges[name] = set()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        walk.unsafe.append(f"unreadable source ({name})")
        return
    owner = owner or _owner_of(fn)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for target in _resolve(node.func, fn, owner):
            construct = _code_construct(target)
            if construct is not None:
                walk.unsafe.append(
                    f"{construct} ({name}, line {fn.__code__.co_firstlineno + node.lineno - 1})"
                )
                continue
            if isinstance(target, type) and target.__module__.startswith(_UPSTREAM):
                callees = [f for f in (_as_function(vars(target).get("__init__")),) if f is not None]
                klass: type | None = target
            else:
                callee = _as_function(target)
                callees = [callee] if callee is not None else []
                klass = None
            for callee in callees:
                walk.edges[name].add(_qualname(callee))
                _walk(callee, walk, klass)


def _cycles(edges: dict[str, set[str]]) -> list[str]:
    """Functions that can reach themselves (direct or mutual recursion)."""
    recursive = []
    for start in edges:
        seen: set[str] = set()
        stack = list(edges[start])
        while stack:
            node = stack.pop()
            if node == start:
                recursive.append(start)
                break
            if node in seen:
                continue
            seen.add(node)
            stack.extend(edges.get(node, ()))
    return recursive


@cache
def audit_family(name: str) -> Finding:
    """Walk family ``name``'s upstream ``score_answer`` and name every unsafe construct it reaches."""
    import reasoning_gym.factory

    entry = reasoning_gym.factory.DATASETS.get(name)
    if entry is None:
        return Finding(name, (f"unknown family {name!r}",), 0)
    dataset_cls = entry[0]
    walk = _Walk()
    for fn in _class_functions(dataset_cls, "score_answer"):
        _walk(fn, walk, dataset_cls)
    unsafe = list(dict.fromkeys(walk.unsafe))
    unsafe += [f"recursion ({fn})" for fn in sorted(_cycles(walk.edges))]
    return Finding(name, tuple(unsafe), len(walk.functions))


def all_families() -> list[str]:
    import reasoning_gym.factory

    return sorted(reasoning_gym.factory.DATASETS)


def verdict(name: str) -> str:
    """What swarmnode does about family ``name``: its own scorer, upstream's, or a refusal."""
    if name in SAFE_SCORER_NOTES:
        return SAFE_SCORER_NOTES[name]
    return "upstream scorer" if audit_family(name).safe else "refused (task_not_allowed)"


def table(families: list[str]) -> str:
    """The audit as a markdown table: family, unsafe constructs found, what the project does."""
    rows = ["| family | unsafe constructs in upstream's scorer | swarmnode |", "|---|---|---|"]
    for name in families:
        found = "; ".join(audit_family(name).unsafe) or "none"
        rows.append(f"| {name} | {found} | {verdict(name)} |")
    return "\n".join(rows)


__all__ = ["Finding", "all_families", "audit_family", "table", "verdict"]
