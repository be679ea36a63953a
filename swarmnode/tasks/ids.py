"""Task identifiers.

A task is named by (dataset, config, seed, index, prompt format). The config is
canonical JSON (sorted keys, no spaces), so two peers that build the same
dataset produce byte-identical ids, and the id alone regenerates the task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from swarmnode.errors import TaskError

#: How a reasoning-gym entry becomes the model's prompt.
#: ``question``: the generator's question text verbatim (what SAPO's agents saw).
#: ``compact``: for arithmetic generators, the bare expression with spaces
#: removed and a trailing ``=``, e.g. ``58+26=``. The built-in tiny model uses
#: it: a 1 M-parameter model cannot afford 60 characters of fixed instruction.
PROMPT_FORMATS = ("question", "compact")

MAX_DATASET_NAME = 64
MAX_CONFIG_JSON = 1024

#: reasoning-gym datasets whose entry ``index`` of a dataset seeded ``seed`` is drawn from
#: ``Random(seed + index)`` alone (their ``__getitem__``; ``tests/tasks/test_ids.py`` checks the
#: installed source and the entries). For them ``(seed + k, index - k)`` names the same question
#: and answer as ``(seed, index)``: a peer could rename one of a node's held-out tasks and have it
#: trained on, or send one question under k names (red team rt61 F1). ``entry_key`` is the same
#: for every such spelling. Left out: ``composite`` (its entries depend on the seeds of the
#: datasets it mixes), ``gsm_symbolic`` and ``list_functions`` (their ``__init__`` draws from
#: ``Random(seed)`` too), ``codeio`` (one id regenerates different prompts: rt62 F5).
#:
#: What an entry key does not do: tell apart the ids of *different* entries that happen to ask
#: the same question. A family with few distinct questions (2-term sums of 1-2 digit numbers)
#: repeats them under many entries, so its held-out set overlaps the training stream by content
#: (a node's own draws hit a held-out prompt 21% of the time in the default mixture) and a peer can
#: find other entries with a held-out question (red team rt62 F1). Held-out accuracy on such a
#: family measures the family's distribution, not unseen questions. Comparing by prompt text
#: instead would make an honest node's repeat of a question (the same answers under a new entry)
#: a ``duplicate`` charged to it.
SEED_PLUS_INDEX = frozenset(
    """
    ab advanced_geometry aiw arc_1d arc_agi base_conversion basic_arithmetic bf
    binary_alternation binary_matrix bitwise_arithmetic boxnet caesar_cipher calendar_arithmetic
    chain_sum circuit_logic coin_flip color_cube_rotation complex_arithmetic count_bits
    count_primes countdown course_schedule cryptarithm decimal_arithmetic decimal_chain_sum dice
    emoji_mystery family_relationships figlet_font fraction_simplification futoshiki
    game_of_life game_of_life_halting gcd graph_color group_anagrams intermediate_integration
    isomorphic_strings jugs kakurasu knight_swap knights_knaves largest_island lcm leg_counting
    letter_counting letter_jumble mahjong_puzzle manipulate_matrix maze mini_sudoku modulo_grid
    n_queens needle_haystack number_filtering number_format number_sequence number_sorting
    palindrome_generation palindrome_partitioning path_star polynomial_equations
    polynomial_multiplication pool_matrix power_function prime_factorization products
    propositional_logic puzzle24 quantum_lock ransom_note rearc rectangle_count rotate_matrix
    rotten_oranges rubiks_cube rush_hour self_reference sentence_reordering shortest_path
    simple_equations simple_geometry simple_integration sokoban spell_backward spiral_matrix
    string_insertion string_manipulation string_splitting string_synthesis sudoku survo
    syllogism time_intervals tower_of_hanoi tsumego word_ladder word_sequence_reversal
    word_sorting zebra_puzzles
    """.split()
)


def canonical_config(config: dict[str, Any]) -> str:
    """The one JSON spelling of a dataset config used inside task ids."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class TaskId:
    """Everything needed to regenerate one task, and nothing else."""

    dataset: str
    config: str  # canonical JSON, see canonical_config
    seed: int
    index: int
    prompt_format: str = "question"

    def __post_init__(self) -> None:
        if not self.dataset or len(self.dataset) > MAX_DATASET_NAME:
            raise TaskError(f"task dataset name {self.dataset!r} must be 1-{MAX_DATASET_NAME} chars")
        if len(self.config) > MAX_CONFIG_JSON:
            raise TaskError(f"task config is {len(self.config)} bytes; the limit is {MAX_CONFIG_JSON}")
        if self.index < 0 or self.seed < 0:
            raise TaskError(f"task seed and index must be >= 0 (got seed={self.seed}, index={self.index})")
        if self.prompt_format not in PROMPT_FORMATS:
            raise TaskError(
                f"task prompt_format {self.prompt_format!r} is unknown; allowed: {', '.join(PROMPT_FORMATS)}"
            )

    def config_dict(self) -> dict[str, Any]:
        try:
            value = json.loads(self.config)
        except json.JSONDecodeError as exc:
            raise TaskError(f"task config is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise TaskError("task config must be a JSON object")
        return value

    def key(self) -> str:
        """A short, stable string form (for logs, ledger rows and dict keys)."""
        return f"{self.dataset}:{self.config}:{self.seed}:{self.index}:{self.prompt_format}"

    def entry_key(self) -> str:
        """What names the question itself: equal for every id that regenerates the same entry of
        a ``SEED_PLUS_INDEX`` dataset, ``key()`` for any other. What a node compares when it asks
        "the same task?" of a peer's group (held out, already received, already taught)."""
        if self.dataset not in SEED_PLUS_INDEX:
            return self.key()
        return f"{self.dataset}:{self.config}:+{self.seed + self.index}:{self.prompt_format}"
