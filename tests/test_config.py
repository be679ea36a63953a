"""Config: TOML < environment < flags; every invalid value is named with what is allowed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from swarmnode.config import Config, load_config, reference_markdown, render_commented_config
from swarmnode.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_need_no_file(tmp_path: Path) -> None:
    config = load_config(tmp_path / "absent.toml", environ={})
    assert config == Config()


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml", "[learn]\nlr = 0.001\nupdates_per_round = 2\n[rollout]\ngroup_size = 4\n"
    )
    config = load_config(
        path,
        environ={"SWARMNODE_LEARN__LR": "0.002", "SWARMNODE_ROLLOUT__GROUP_SIZE": "6"},
        overrides={"rollout.group_size": 12},
    )
    assert config.learn.lr == 0.002  # env beats file
    assert config.learn.updates_per_round == 2  # file beats default
    assert config.rollout.group_size == 12  # flag beats env


def test_env_values_parse_as_toml_literals(tmp_path: Path) -> None:
    config = load_config(
        None,
        environ={
            "SWARMNODE_SWARM__INITIAL_PEERS": '["/ip4/127.0.0.1/tcp/1/p2p/Qm"]',
            "SWARMNODE_SWARM__CLIENT_MODE": "true",
            "SWARMNODE_NODE__NAME": "alice",
            "UNRELATED": "1",
        },
    )
    assert config.swarm.initial_peers == ["/ip4/127.0.0.1/tcp/1/p2p/Qm"]
    assert config.swarm.client_mode is True
    assert config.node.name == "alice"


def test_an_invalid_value_names_the_key_the_value_and_what_is_allowed(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[learn]\nalgorithm = "ppo"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    message = str(info.value)
    assert "learn.algorithm" in message and "'ppo'" in message
    assert "grpo" in message and "gspo" in message
    assert str(path) in message


def test_out_of_range_values_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"rollout.group_size = 0.*greater than or equal to 1"):
        load_config(None, environ={}, overrides={"rollout.group_size": 0})


def test_relaying_with_rounds_too_long_for_admissions_age_window_is_refused_at_start() -> None:
    # Red team rt72 F-C: with 120-s rounds every relayed batch would turn too old before its last
    # reader judged it, so the node relayed nothing, silently.
    from swarmnode.roles.trainer import check_relaying

    def config(**overrides: object) -> Config:
        return load_config(None, environ={}, overrides=overrides)

    with pytest.raises(ConfigError, match=r"swarm.relay needs swarm.round_seconds <= 76.7 \(got 120\)"):
        check_relaying(config(**{"swarm.relay": True, "swarm.round_seconds": 120}))
    check_relaying(config(**{"swarm.relay": True, "swarm.round_seconds": 60}))  # fits
    check_relaying(config(**{"swarm.round_seconds": 120}))  # no relaying: any round


def test_an_unknown_key_is_an_error_not_silently_ignored() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'learn\.learning_rate'"):
        load_config(None, environ={}, overrides={"learn.learning_rate": 1e-3})


def test_an_error_in_a_list_entry_names_its_index_and_its_name(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        '[[tasks.datasets]]\nname = "chain_sum"\n[[tasks.datasets]]\nname = "products"\nweight = "heavy"\n',
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert str(info.value).startswith(
        "tasks.datasets[1] (products): invalid config value weight = 'heavy': Input should be a valid number"
    )
    with pytest.raises(ConfigError, match=r"^tasks\.datasets\[0\]: missing config key 'name'$"):
        load_config(None, environ={}, overrides={"tasks.datasets": [{"weight": 2}]})


def test_the_tasks_dataset_keys_are_in_the_reference_and_the_commented_config() -> None:
    table = reference_markdown()
    assert "| `tasks.datasets` | `[]` | `SWARMNODE_TASKS__DATASETS` | Your own mixture" in table
    assert "| `tasks.warm_start_datasets` | `[]` |" in table
    text = render_commented_config()
    assert "datasets = []\n" in text and "warm_start_datasets = []\n" in text


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "[learn\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, environ={})


def test_the_commented_config_is_valid_toml_that_loads_back_to_the_defaults(tmp_path: Path) -> None:
    text = render_commented_config()
    assert "# AdamW learning rate." in text
    tomllib.loads(text)
    assert load_config(write(tmp_path / "c.toml", text), environ={}) == Config()


def test_reference_lists_every_key() -> None:
    table = reference_markdown()
    for section, model in Config.model_fields.items():
        assert model.annotation is not None
        for key in model.annotation.model_fields:  # type: ignore[union-attr]
            assert f"`{section}.{key}`" in table


def test_readme_configuration_reference_is_up_to_date() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    start, end = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
    section = readme[readme.index(start) + len(start) : readme.index(end)].strip()
    assert section == reference_markdown().strip(), (
        "README's configuration reference is stale: paste the output of `swarmnode config reference`"
    )


def test_large_swarm_settings_follow_the_readme_rules() -> None:
    from swarmnode.config import large_swarm_settings

    def settings(nodes: int, **overrides: object) -> tuple[int, int, int]:
        got = large_swarm_settings(nodes, load_config(None, environ={}, overrides=overrides))
        return got.round_demand, got.announce_buckets, got.read_buckets

    assert settings(10_000) == (2, 157, 2)  # the defaults: mixing = "none", the least demand
    assert settings(64) == (2, 1, 0)  # one key: read it all
    sapo = {"swarm.mixing": "sapo", "swarm.external_groups": 24, "rollout.prompts_per_round": 8}
    assert settings(1000, **sapo) == (5, 16, 2)  # ceil(1.5 x 24 / 8) = ceil(4.5)
    assert settings(1000, **{**sapo, "swarm.external_groups": 0}) == (2, 16, 2)
    with pytest.raises(ConfigError, match=r"--nodes must be at least 1 \(got 0\)"):
        large_swarm_settings(0)
    with pytest.raises(ConfigError, match=r"swarm.round_demand would be 6144, above its limit 4096"):
        large_swarm_settings(
            10, load_config(None, environ={}, overrides={**sapo, "swarm.external_groups": 32768})
        )
