"""Task mixtures from config: ``[[tasks.datasets]]``, its checks at start, specialist warm starts,
and peers on different mixtures interoperating through admission. Real reasoning-gym generators."""

from __future__ import annotations

import dataclasses
import math
import shutil
import tomllib
import typing
from collections import Counter
from pathlib import Path

import pytest
import reasoning_gym.factory

from swarmnode.admit import (
    Accepted,
    AdmissionConfig,
    AdmissionPipeline,
    Rejected,
    RejectReason,
    task_families,
)
from swarmnode.config import Config, TaskDatasetConfig, load_config, render_commented_config
from swarmnode.errors import ConfigError, TaskError
from swarmnode.home import NodeHome
from swarmnode.identity import NodeIdentity
from swarmnode.policy import load_policy
from swarmnode.policy.warmstart import (
    SPECIALIST_WARM_START,
    WarmStartSettings,
    _mixture_description,
    read_warm_start_info,
    warm_start,
    warm_start_dir,
)
from swarmnode.roles.common import build_mixture, build_policy, build_warm_start_mixture
from swarmnode.tasks import (
    PROMPT_FORMATS,
    DatasetSpec,
    TaskMixture,
    default_mixture,
    generator_config_keys,
    mixture_from_specs,
    sapo_mixture,
)
from swarmnode.tools import vectors
from swarmnode.wire.envelope import encode_envelope, seal, to_ms
from swarmnode.wire.messages import RolloutBatch

CHAIN_SUM_2 = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}

MIXED = """
[tasks]
seed = 5

[[tasks.datasets]]
name = "chain_sum"
config = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 2 }
weight = 3
prompt_format = "compact"

[[tasks.datasets]]
name = "basic_arithmetic"
[tasks.datasets.config]
min_terms = 2
max_terms = 3
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def config_of(text: str, tmp_path: Path) -> Config:
    return load_config(write(tmp_path / "swarmnode.toml", text), environ={})


def datasets_toml(*entries: str, key: str = "tasks.datasets") -> str:
    return "\n".join(f"[[{key}]]\n{entry}\n" for entry in entries)


def start_error(text: str, tmp_path: Path) -> str:
    """The ConfigError a node gets at start (config load, then its mixture build) for ``text``."""
    with pytest.raises(ConfigError) as info:
        build_mixture(config_of(text, tmp_path))
    return str(info.value)


# ------------------------------------------------------------------ the TOML shape


def test_datasets_replace_the_preset_and_the_mixture_draws_only_from_them(tmp_path: Path) -> None:
    config = config_of(MIXED, tmp_path)
    assert config.tasks.datasets == [
        TaskDatasetConfig(name="chain_sum", config=CHAIN_SUM_2, weight=3.0, prompt_format="compact"),
        TaskDatasetConfig(name="basic_arithmetic", config={"min_terms": 2, "max_terms": 3}),
    ]
    mixture = build_mixture(config)
    assert mixture.seed == 5
    assert mixture.specs == [
        DatasetSpec("chain_sum", CHAIN_SUM_2, 3.0, "compact"),
        DatasetSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 3}, 1.0, "question"),
    ]
    tasks = mixture.sample(0, 400)
    counts = Counter(task.id.dataset for task in tasks)
    assert set(counts) == {"chain_sum", "basic_arithmetic"}
    assert 0.65 < counts["chain_sum"] / len(tasks) < 0.85  # weight 3 of 4
    compact = [t for t in tasks if t.id.dataset == "chain_sum"]
    assert all(t.prompt.endswith("=") and " " not in t.prompt for t in compact)
    question = [t for t in tasks if t.id.dataset == "basic_arithmetic"]
    assert all(t.id.prompt_format == "question" and t.prompt == t.entry["question"] for t in question)
    assert mixture.sample(0, 400) == tasks  # deterministic in seed and round


def test_without_datasets_the_presets_are_unchanged(tmp_path: Path) -> None:
    assert build_mixture(Config()).specs == default_mixture(0).specs
    sapo = build_mixture(config_of('[tasks]\nmixture = "sapo"\n', tmp_path))
    assert sapo.specs == sapo_mixture(0).specs


def test_an_explicit_default_preset_with_datasets_is_fine(tmp_path: Path) -> None:
    """`swarmnode init` writes mixture = "default"; adding datasets to that file must work."""
    config = config_of(
        '[tasks]\nmixture = "default"\n' + datasets_toml('name = "basic_arithmetic"'), tmp_path
    )
    assert [s.name for s in build_mixture(config).specs] == ["basic_arithmetic"]


def test_a_non_default_preset_and_datasets_together_are_an_error_naming_both(tmp_path: Path) -> None:
    text = '[tasks]\nmixture = "sapo"\n' + datasets_toml('name = "basic_arithmetic"')
    with pytest.raises(ConfigError) as info:
        config_of(text, tmp_path)
    message = str(info.value)
    assert "tasks.mixture = 'sapo'" in message and "tasks.datasets" in message
    assert str(tmp_path / "swarmnode.toml") in message


def test_datasets_can_come_from_the_environment() -> None:
    environ = {"SWARMNODE_TASKS__DATASETS": '[{name = "chain_sum", config = {max_terms = 3}, weight = 2}]'}
    config = load_config(None, environ=environ)
    assert build_mixture(config).specs == [DatasetSpec("chain_sum", {"max_terms": 3}, 2.0, "question")]


def test_the_commented_config_renders_datasets_as_toml_that_loads_back(tmp_path: Path) -> None:
    config = config_of(MIXED + datasets_toml('name = "products"', key="tasks.warm_start_datasets"), tmp_path)
    text = render_commented_config(config)
    assert "# Your own mixture, replacing the preset" in text
    tomllib.loads(text)
    assert load_config(write(tmp_path / "again.toml", text), environ={}) == config


def test_the_prompt_formats_in_the_schema_are_the_ones_tasks_support() -> None:
    annotation = TaskDatasetConfig.model_fields["prompt_format"].annotation
    assert typing.get_args(annotation) == PROMPT_FORMATS


def test_generator_config_keys_are_the_config_dataclass_fields_less_seed_and_size() -> None:
    fields = {f.name for f in dataclasses.fields(reasoning_gym.factory.DATASETS["products"][1])}
    assert set(generator_config_keys("products")) == fields - {"seed", "size"}
    assert "max_digits" in generator_config_keys("products")
    with pytest.raises(TaskError, match="unknown reasoning-gym generator 'prodcts'; did you mean 'products'"):
        generator_config_keys("prodcts")


# ------------------------------------------------------------------ checks at start


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (
            [
                'name = "chain_sum"',
                'name = "basic_arithmetic"',
                'name = "products"\nconfig = { max_digitz = 2 }',
            ],
            "tasks.datasets[2] (products): unknown config key 'max_digitz' (did you mean 'max_digits'?); "
            "known: allow_negation, max_digits, max_terms, min_digits, min_terms",
        ),
        (
            ['name = "chain_summ"'],
            "tasks.datasets[0] (chain_summ): unknown reasoning-gym generator 'chain_summ'; "
            "did you mean 'chain_sum'?",
        ),
        (
            ['name = "chain_sum"\nconfig = { seed = 3 }'],
            "tasks.datasets[0] (chain_sum): config key 'seed' cannot be set per dataset",
        ),
        (
            ['name = "chain_sum"\nconfig = { size = 10 }'],
            "tasks.datasets[0] (chain_sum): config key 'size' cannot be set per dataset",
        ),
        (  # an unsafe family (its upstream scorer evals the answer; no safe scorer shipped)
            ['name = "chain_sum"', 'name = "spiral_matrix"'],
            "tasks.datasets[1] (spiral_matrix): reasoning-gym family 'spiral_matrix' is refused: "
            "its scorer reaches eval",
        ),
        (  # the generator's own validation
            ['name = "chain_sum"\nconfig = { min_terms = 3, max_terms = 2 }'],
            "tasks.datasets[0] (chain_sum): cannot build reasoning-gym dataset 'chain_sum'",
        ),
        (  # compact prompts need an arithmetic expression
            ['name = "binary_matrix"\nprompt_format = "compact"'],
            "tasks.datasets[0] (binary_matrix): prompt_format 'compact' needs an arithmetic entry",
        ),
        (
            ['name = "chain_sum"\nweight = 1', 'name = "basic_arithmetic"', 'name = "chain_sum"\nweight = 2'],
            "tasks.datasets[2] (chain_sum): the same generator, config and prompt_format as "
            "tasks.datasets[0]",
        ),
        (
            ['name = "chain_sum"\nweight = 0'],
            "tasks.datasets[0] (chain_sum): invalid config value weight = 0: Input should be greater than 0",
        ),
        (
            ['name = "chain_sum"\nweight = -1.5'],
            "tasks.datasets[0] (chain_sum): invalid config value weight = -1.5",
        ),
        (
            ['name = "chain_sum"\nweight = inf'],
            "tasks.datasets[0] (chain_sum): invalid config value weight = inf: "
            "Input should be a finite number",
        ),
        (
            ['name = "chain_sum"\nweight = nan'],
            "tasks.datasets[0] (chain_sum): invalid config value weight = nan",
        ),
        (
            ['name = "chain_sum"\nprompt_format = "chat"'],
            "tasks.datasets[0] (chain_sum): invalid config value prompt_format = 'chat': "
            "Input should be 'question' or 'compact'",
        ),
        (
            ['name = "chain_sum"\nwieght = 2'],
            "tasks.datasets[0] (chain_sum): unknown config key 'wieght'",
        ),
        (["config = { max_terms = 2 }"], "tasks.datasets[0]: missing config key 'name'"),
    ],
)
def test_a_bad_entry_is_an_error_at_start_naming_it(
    entries: list[str], expected: str, tmp_path: Path
) -> None:
    assert expected in start_error(datasets_toml(*entries), tmp_path)


def test_the_same_generator_with_another_config_or_format_is_not_a_duplicate(tmp_path: Path) -> None:
    text = datasets_toml(
        'name = "chain_sum"\nprompt_format = "compact"',
        'name = "chain_sum"\nprompt_format = "question"',
        'name = "chain_sum"\nconfig = { max_terms = 3 }\nprompt_format = "compact"',
    )
    assert len(task_families(build_mixture(config_of(text, tmp_path)))) == 3


def test_mixture_from_specs_checks_specs_built_in_code_too() -> None:
    with pytest.raises(
        ConfigError, match=r"tasks.datasets\[0\] \(chain_sum\): weight must be finite and > 0"
    ):
        mixture_from_specs([DatasetSpec("chain_sum", weight=math.inf)])
    with pytest.raises(ConfigError, match=r"tasks.datasets\[0\] \(chain_sum\): unknown prompt_format 'chat'"):
        mixture_from_specs([DatasetSpec("chain_sum", prompt_format="chat")])
    with pytest.raises(ConfigError, match=r"^tasks\.datasets is empty"):
        mixture_from_specs([])
    with pytest.raises(TaskError, match="finite"):
        TaskMixture([DatasetSpec("chain_sum", weight=math.inf)])


def test_warm_start_datasets_are_checked_under_their_own_key(tmp_path: Path) -> None:
    text = datasets_toml('name = "chain_sum"', 'name = "producs"', key="tasks.warm_start_datasets")
    config = config_of(text, tmp_path)
    with pytest.raises(
        ConfigError, match=r"^tasks.warm_start_datasets\[1\] \(producs\): unknown reasoning-gym"
    ):
        build_warm_start_mixture(config, build_mixture(config))


def test_a_bad_warm_start_entry_is_refused_even_when_a_model_path_makes_it_unused(tmp_path: Path) -> None:
    text = f'[model]\npath = "{tmp_path / "no-model"}"\n' + datasets_toml(
        'name = "chain_sum"\nconfig = { max_digitz = 2 }', key="tasks.warm_start_datasets"
    )
    config = config_of(text, tmp_path)
    with pytest.raises(
        ConfigError, match=r"tasks.warm_start_datasets\[0\] \(chain_sum\): unknown config key"
    ):
        build_policy(config, NodeHome(tmp_path), build_mixture(config))


# ------------------------------------------------------------------ specialist warm starts

QUICK = WarmStartSettings(
    batch_size=16, max_steps=4, eval_every=2, eval_tasks=16, heldout_tasks=16, target_accuracy=1.0
)
THREE_TERMS = (
    'name = "chain_sum"\nconfig = { min_terms = 3, max_terms = 3, max_digits = 1 }\nprompt_format = "compact"'
)
ONE_DIGIT = (
    'name = "chain_sum"\nconfig = { min_terms = 2, max_terms = 2, max_digits = 1 }\nprompt_format = "compact"'
)


def test_without_warm_start_datasets_the_warm_start_uses_the_training_mixture(tmp_path: Path) -> None:
    config = config_of(MIXED, tmp_path)
    training = build_mixture(config)
    assert build_warm_start_mixture(config, training) is training


def test_specialists_get_their_own_warm_start_mixture_and_cache_directory(tmp_path: Path) -> None:
    a = config_of(MIXED + datasets_toml(THREE_TERMS, key="tasks.warm_start_datasets"), tmp_path)
    b = config_of(MIXED + datasets_toml(ONE_DIGIT, key="tasks.warm_start_datasets"), tmp_path)
    training = build_mixture(a)
    warm_a, warm_b = build_warm_start_mixture(a, training), build_warm_start_mixture(b, training)
    assert warm_a.specs == [
        DatasetSpec("chain_sum", {"min_terms": 3, "max_terms": 3, "max_digits": 1}, 1.0, "compact")
    ]
    assert warm_a.seed == training.seed == 5
    assert all(task.prompt.count("+") + task.prompt.count("-") >= 2 for task in warm_a.sample(0, 50))
    descriptions = {str(_mixture_description(m)) for m in (training, warm_a, warm_b)}
    assert len(descriptions) == 3
    dirs = {warm_start_dir(tmp_path, m, 0, QUICK) for m in (training, warm_a, warm_b)}
    assert len(dirs) == 3

    path_a, path_b = (
        warm_start(tmp_path, warm_a, 0, settings=QUICK),
        warm_start(tmp_path, warm_b, 0, settings=QUICK),
    )
    assert path_a != path_b and {path_a, path_b} <= dirs
    for path, mixture in ((path_a, warm_a), (path_b, warm_b)):
        recorded = read_warm_start_info(path)["settings"]["mixture"]
        assert recorded == _mixture_description(mixture)
        assert recorded["specs"][0]["config"] == mixture.specs[0].config


def test_build_policy_warm_starts_the_tiny_model_on_the_configured_specialist(tmp_path: Path) -> None:
    """build_policy looks for (and would train) the specialist's cache, not the training mixture's:
    a specialist model placed at its cache directory is loaded as is, nothing else is trained."""
    config = config_of(MIXED + datasets_toml(THREE_TERMS, key="tasks.warm_start_datasets"), tmp_path)
    home = NodeHome(tmp_path / "home")
    training = build_mixture(config)
    specialist = build_warm_start_mixture(config, training)
    quick = warm_start(tmp_path / "quick", specialist, config.node.seed, settings=QUICK)
    # A specialist stops at mastery (SPECIALIST_WARM_START), not at the default's 12% on hard tasks.
    expected = warm_start_dir(home.root, specialist, config.node.seed, SPECIALIST_WARM_START)
    assert expected != warm_start_dir(home.root, training, config.node.seed)
    shutil.copytree(quick, expected)

    policy = build_policy(config, home, training)

    assert [p.name for p in home.models.iterdir()] == [expected.name]
    reference = load_policy(quick)
    for (name, got), (_, want) in zip(
        policy.model.state_dict().items(), reference.model.state_dict().items(), strict=True
    ):
        assert got.equal(want), name


# ------------------------------------------------------------------ peers on different mixtures

ALICE = NodeIdentity.from_seed((1).to_bytes(32, "big"))


def _envelope(task_index: int, mixture: TaskMixture, at: float) -> bytes:
    (task,) = [t for t in mixture.sample(task_index, 1)]
    group = vectors.vector_group(task, [str(task.entry["answer"]), "0"])
    return encode_envelope(seal(ALICE, RolloutBatch(groups=(group,)), to_ms(at)))


def test_a_group_outside_the_receivers_datasets_is_refused_task_not_allowed_charged_to_nobody(
    tmp_path: Path,
) -> None:
    """Alice trains on chain_sum and basic_arithmetic; the receiver is configured for chain_sum only.
    Her basic_arithmetic groups are refused ``task_not_allowed`` and never lower her score; her
    chain_sum groups are accepted; a receiver configured with basic_arithmetic accepts the same bytes."""
    t0 = vectors.NOW
    alice = build_mixture(config_of(MIXED, tmp_path))
    chain_only = config_of(
        "[tasks]\nseed = 5\n"
        + datasets_toml(
            'name = "chain_sum"\nconfig = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 2 }\n'
            'prompt_format = "compact"'
        ),
        tmp_path,
    )
    receiver = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=task_families(build_mixture(chain_only))), now=t0
    )
    both = AdmissionPipeline(AdmissionConfig(allowed_tasks=task_families(alice)), now=t0)

    chain_round = next(r for r in range(100) if alice.sample(r, 1)[0].id.dataset == "chain_sum")
    first = receiver.admit(_envelope(chain_round, alice, t0), t0, via="transport-alice")
    assert isinstance(first, Accepted) and first.sender == ALICE.peer_id
    score = receiver.peers.score(ALICE.peer_id)
    assert score is not None

    other_rounds = [r for r in range(200) if alice.sample(r, 1)[0].id.dataset == "basic_arithmetic"][:10]
    assert len(other_rounds) == 10
    for n, r in enumerate(other_rounds):
        data = _envelope(r, alice, t0 + 0.01 * (n + 1))
        verdict = receiver.admit(data, t0 + 1, via="transport-alice")
        assert isinstance(verdict, Rejected), verdict
        assert verdict.reason is RejectReason.TASK_NOT_ALLOWED
        assert "basic_arithmetic" in verdict.detail and "is not one we train on" in verdict.detail
        assert verdict.charged is None
        assert isinstance(both.admit(data, t0 + 1, via="transport-alice"), Accepted)
    assert receiver.peers.score(ALICE.peer_id) == score
    assert receiver.banned_until(ALICE.peer_id, t0 + 1) is None
    assert receiver.banned_until("transport-alice", t0 + 1) is None

    later_chain = next(
        r for r in range(chain_round + 1, 200) if alice.sample(r, 1)[0].id.dataset == "chain_sum"
    )
    assert isinstance(receiver.admit(_envelope(later_chain, alice, t0 + 1), t0 + 1), Accepted)
