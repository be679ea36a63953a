"""The project's own scorers for reasoning-gym families whose upstream scorer is unsafe on peer text.

Owns: a scorer per family that upstream scores with ``eval`` or an unbounded
recursive parser, giving the same reward as upstream on every answer an honest
model writes, and a bounded cost on every other one. Must not: change the
reward of a well-formed answer, or call ``eval``/``exec`` on anything.

Why each exists (the audit in ``swarmnode.tasks.audit`` finds them; the table
is in the README's Reliability section):

- ``binary_matrix``: upstream ``eval()``s any answer that is not exactly the
  oracle, to accept a Python list of lists. We read that list with
  ``ast.literal_eval`` (literals only: no names, calls or operators) after a
  size and nesting cap, then compare as upstream does (reward 0.1).
- ``propositional_logic``: upstream's ``parse_expr`` recurses once per
  parenthesis or negation and copies the string at each level (quadratic), and
  its truth table is ``2 ** len(leaves)``: 3,500 nested parentheses raised
  ``RecursionError``, a 3,000-character negation chain cost > 5 s, and leaves
  that are not the task's variables grow the table. We cap the answer's length,
  nesting and negations, refuse leaves that are not the task's variables (an
  answer naming symbols the premises do not have is not a conclusion from them:
  reward 0.0, where upstream could pay 0.05-1.0), and then call upstream's own
  scoring on what remains, so well-formed answers score exactly as upstream.
- ``coin_flip``: upstream runs ``float(Fraction(answer))``, and ``Fraction``
  builds the exact integer an exponent names: ``1e10000000`` cost 6.8 s of CPU
  (red team rt24). We pass upstream only a plain number or a fraction of at most
  64 digits each, with an exponent of at most 3 digits; anything else scores
  0.0 (upstream pays 0.0 for any answer that is no number, and no probability
  needs more digits). Upstream's partial credit divides the matching prefix by the
  shorter string's length, so ``0`` matched whole and paid 1.0 on every task; ours
  divides by the oracle's (red team rt86 F1).
- ``game_of_life_halting``: upstream pays 1.0 when ``bool(answer) ==
  bool(entry["answer"])``, and the oracle is the text ``True`` or ``False``, so
  any non-empty answer paid 1.0 (red team rt86 F2). Ours pays 1.0 for the
  oracle's word alone.

Where an upstream scorer cannot tell right from wrong, it is a reward a peer (or our
own model) earns for a constant answer: ``solved`` counts it, and training learns it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from swarmnode.tasks.upstream import upstream_scorer

#: Answers longer than this many times the oracle's length (plus a small constant) are not read.
MATRIX_CHARS_PER_ORACLE_CHAR = 8
MAX_LITERAL_DEPTH = 4  # brackets: a matrix needs 2

# Generated conclusions are < 60 characters with <= 3 operators; upstream's parser is quadratic in
# length times operators, so these caps keep one answer's cost near a millisecond.
PROPOSITION_MAX_CHARS = 256
PROPOSITION_MAX_DEPTH = 16  # parentheses
PROPOSITION_MAX_NEGATIONS = 16
PROPOSITION_MAX_OPERATORS = 16

# A probability as coin_flip's upstream parses it (``Fraction``'s grammar), within bounds that keep
# the exact number it builds small: at most 64 digits per part, an exponent of at most 999.
_BOUNDED_NUMBER = re.compile(
    r"\s*[+-]?(?:\d{1,64}(?:\.\d{0,64})?|\.\d{1,64})(?:[eE][+-]?\d{1,3})?\s*"
    r"|\s*[+-]?\d{1,64}\s*/\s*\d{1,64}\s*"
)
COIN_FLIP_MAX_CHARS = 256
#: Upstream's ``score_answer`` tolerance for a right probability.
COIN_FLIP_TOLERANCE = 1e-4

_NEGATION = "¬"
_OPERATORS = ("∧", "∨", "→", "↔")


def _bracket_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def bounded_literal(text: str, max_chars: int, max_depth: int = MAX_LITERAL_DEPTH) -> Any:
    """``ast.literal_eval(text)`` if ``text`` is short and shallow enough, else ``None``.

    ``literal_eval`` runs no code, but parsing is recursive and a long digit
    string is an expensive int: both are capped first."""
    if len(text) > max_chars or _bracket_depth(text) > max_depth:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def score_binary_matrix(answer: str | None, entry: dict[str, Any]) -> float:
    """Upstream's rule (1.0 exact, 0.1 for the right matrix as a Python list), without ``eval``."""
    oracle = entry["answer"]
    if answer is None:
        return 0.0
    if answer == oracle:
        return 1.0
    value = bounded_literal(answer, MATRIX_CHARS_PER_ORACLE_CHAR * len(oracle) + 64)
    if not isinstance(value, list | tuple) or not all(isinstance(row, list | tuple) for row in value):
        return 0.0
    text = "\n".join(" ".join(str(x) for x in row) for row in value)
    return 0.1 if text == oracle else 0.0


def _proposition_leaves(answer: str) -> list[str]:
    """The atoms of a propositional answer: the text between operators, parentheses and negations."""
    text = answer
    for token in (*_OPERATORS, _NEGATION, "(", ")"):
        text = text.replace(token, " ")
    return text.split()


def score_propositional_logic(answer: str | None, entry: dict[str, Any]) -> float:
    """Upstream's rule on answers within caps whose atoms are the task's variables; else 0.0."""
    if not isinstance(answer, str):
        return 0.0
    if (
        len(answer) > PROPOSITION_MAX_CHARS
        or _bracket_depth(answer) > PROPOSITION_MAX_DEPTH
        or answer.count(_NEGATION) > PROPOSITION_MAX_NEGATIONS
        or sum(answer.count(op) for op in _OPERATORS) > PROPOSITION_MAX_OPERATORS
    ):
        return 0.0
    variables = set(entry["metadata"]["variables"])
    if any(leaf not in variables for leaf in _proposition_leaves(answer)):
        return 0.0
    return float(upstream_scorer("propositional_logic")(answer, entry))


def score_coin_flip(answer: str | None, entry: dict[str, Any]) -> float:
    """Upstream's rule for a bounded number or fraction (1.0 within 1e-4 of the oracle, else partial
    credit for the matching prefix of the two values' 10-digit forms), the prefix counted over the
    oracle's length; 0.0 for anything else."""
    if not isinstance(answer, str) or len(answer) > COIN_FLIP_MAX_CHARS:
        return 0.0
    if _BOUNDED_NUMBER.fullmatch(answer.replace(",", "")) is None:  # upstream drops commas first
        return 0.0
    try:
        got, oracle = (float(Fraction(text.replace(",", ""))) for text in (answer, str(entry["answer"])))
    except (ValueError, ZeroDivisionError, OverflowError):
        return 0.0
    if abs(got - oracle) <= COIN_FLIP_TOLERANCE:
        return 1.0
    # Upstream divides the matching prefix by the SHORTER form's length, so "0" (or "0.2" against
    # 0.2255859375) matched whole and paid 1.0 on every task (red team rt86 F1).
    got_text, oracle_text = f"{got:.10g}", f"{oracle:.10g}"
    matched = 0
    for a, o in zip(got_text, oracle_text, strict=False):
        if a != o:
            break
        matched += 1
    return matched / len(oracle_text)


def score_game_of_life_halting(answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for the oracle's ``True`` or ``False`` (case and surrounding space aside), else 0.0."""
    if not isinstance(answer, str) or len(answer) > 16:
        return 0.0
    return 1.0 if answer.strip().lower() == str(entry["answer"]).strip().lower() else 0.0


#: family -> the project's scorer; these replace upstream's for every completion we score.
SAFE_SCORERS: dict[str, Callable[[str | None, dict[str, Any]], float]] = {
    "binary_matrix": score_binary_matrix,
    "propositional_logic": score_propositional_logic,
    "coin_flip": score_coin_flip,
    "game_of_life_halting": score_game_of_life_halting,
}

#: family -> why its own scorer is safe (the audit table's last column).
SAFE_SCORER_NOTES: dict[str, str] = {
    "binary_matrix": "own scorer: ast.literal_eval after a size and nesting cap",
    "propositional_logic": (
        f"own scorer: <= {PROPOSITION_MAX_CHARS} chars, nesting <= {PROPOSITION_MAX_DEPTH}, "
        f"<= {PROPOSITION_MAX_NEGATIONS} negations, <= {PROPOSITION_MAX_OPERATORS} operators, "
        "atoms must be the task's variables; then upstream"
    ),
    "coin_flip": (
        f"own scorer: <= {COIN_FLIP_MAX_CHARS} chars, a number or fraction of <= 64 digits a part "
        "and an exponent <= 999; then upstream's rule, partial credit over the oracle's length"
    ),
    "game_of_life_halting": (
        "own scorer: the oracle's True or False (upstream paid 1.0 for any non-empty text)"
    ),
}

__all__ = ["SAFE_SCORERS", "SAFE_SCORER_NOTES", "bounded_literal"]
