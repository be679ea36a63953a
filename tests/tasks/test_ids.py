"""Task identity: which ids name the same task (SPEC.md 4.1a)."""

from __future__ import annotations

import inspect
import re

import pytest

from swarmnode.tasks import SPECIALIST_FAMILIES, TaskId, default_mixture, regenerate, sapo_mixture
from swarmnode.tasks.ids import SEED_PLUS_INDEX, canonical_config

#: What makes entry ``index`` of seed ``seed`` the entry ``seed + index``.
SEED_PLUS_INDEX_DRAW = re.compile(r"Random\(\s*self\.(config\.)?seed\s*\+\s*(idx|index)\b")


def test_every_seed_plus_index_generator_draws_its_entries_from_seed_plus_index_alone() -> None:
    # A guard on the installed reasoning-gym: an upgrade that draws otherwise must leave the list.
    from reasoning_gym.factory import DATASETS

    for name in sorted(SEED_PLUS_INDEX):
        cls = DATASETS[name][0]
        assert SEED_PLUS_INDEX_DRAW.search(inspect.getsource(cls.__getitem__)), name
        init = inspect.getsource(cls.__init__)
        assert "Random(self.seed)" not in init and "Random(config.seed)" not in init, name


@pytest.mark.parametrize("k", [1, 17])
def test_ids_that_regenerate_the_same_entry_share_an_entry_key_and_others_do_not(k: int) -> None:
    # Every family of the built-in mixtures and the specialists testbed.
    # sentence_reordering: its entries come from a helper given (seed, index) (red team rt62 F3).
    families = [(s.name, s.config, s.prompt_format) for s in default_mixture().specs]
    families += [(s.name, s.config, s.prompt_format) for s in [*sapo_mixture().specs, *SPECIALIST_FAMILIES]]
    for name, config, prompt_format in [*families, ("sentence_reordering", {}, "question")]:
        assert name in SEED_PLUS_INDEX, name
        task_id = TaskId(name, canonical_config(config), 3, 40, prompt_format)
        renamed = TaskId(name, task_id.config, 3 + k, 40 - k, prompt_format)
        assert (regenerate(task_id).prompt, regenerate(task_id).entry["answer"]) == (
            regenerate(renamed).prompt,
            regenerate(renamed).entry["answer"],
        ), name
        assert task_id.entry_key() == renamed.entry_key() and task_id.key() != renamed.key()
        assert TaskId(name, task_id.config, 3, 41, prompt_format).entry_key() != task_id.entry_key()


def test_a_generator_not_known_to_draw_from_seed_plus_index_is_compared_by_its_whole_id() -> None:
    task_id = TaskId("gsm_symbolic", "{}", 3, 40)  # its __init__ draws from Random(seed) too
    assert "gsm_symbolic" not in SEED_PLUS_INDEX
    assert task_id.entry_key() == task_id.key() != TaskId("gsm_symbolic", "{}", 4, 39).entry_key()
