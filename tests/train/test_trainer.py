"""The training loop: rounds learn, checkpoints resume exactly, a corrupt checkpoint falls back."""

from __future__ import annotations

import dataclasses
import gc
import logging
import random
import statistics
import tracemalloc
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from swarmnode.config import Config, load_config
from swarmnode.learn import zero_advantage
from swarmnode.policy import load_policy
from swarmnode.rollout import make_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import TaskId, default_mixture, regenerate
from swarmnode.train import ScoredGroup, Trainer, completion_logprobs
from swarmnode.train.trainer import distinct, family_of


def config(**overrides: object) -> Config:
    base: dict[str, object] = {
        "rollout.prompts_per_round": 8,
        "rollout.group_size": 4,
        "tasks.heldout_size": 16,
        "checkpoint.every_rounds": 2,
        "learn.lr": 1e-4,
    }
    base.update(overrides)
    return load_config(None, environ={}, overrides=base)


def make_trainer(model: Path, home: Path, cfg: Config, ledger: Ledger) -> Trainer:
    policy = load_policy(model)
    return Trainer(
        cfg,
        policy,
        make_engine("torch", policy),
        default_mixture(0),
        ledger,
        CheckpointStore(home / "ckpt"),
        eval_every=1000,
    )


def shifted(task_id: TaskId, k: int) -> TaskId:
    """Another id of the same task (SPEC 4.1a): reasoning-gym draws entry i of seed s from s + i."""
    return dataclasses.replace(task_id, seed=task_id.seed + k, index=task_id.index - k)


def relabelled(group: ScoredGroup, rewards: list[float], **extra: object) -> ScoredGroup:
    """``group``'s text as if a peer had sent it with these (locally scored) rewards."""
    return ScoredGroup(
        task=group.task,
        prompt_ids=group.prompt_ids,
        completion_ids=group.completion_ids,
        behaviour_logprobs=[],
        texts=group.texts,
        rewards=rewards,
        policy_version=0,
        source="peer",
        **extra,  # type: ignore[arg-type]
    )


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}


def test_completion_logprobs_match_the_engine_that_sampled_them(quick_model: Path) -> None:
    policy = load_policy(quick_model)
    engine = make_engine("torch", policy)
    from swarmnode.rollout import SamplingParams

    result = engine.generate(
        ["12+7=", "5-9="], 3, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(1)
    )
    prompts = [p for p, group in zip(result.prompt_ids, result.completions, strict=True) for _ in group]
    comps = [c.token_ids for group in result.completions for c in group]
    values, mask = completion_logprobs(policy.model, prompts, comps)
    for i, c in enumerate(c for group in result.completions for c in group):
        assert mask[i].sum() == len(c.token_ids)
        assert torch.allclose(values[i, : len(c.logprobs)], torch.tensor(c.logprobs), atol=1e-4)


def test_a_round_updates_the_policy_and_commits_to_the_ledger(quick_model: Path, tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path, config(), ledger)
        before = weights(trainer)
        metrics = [trainer.run_round() for _ in range(3)]
        assert [m.round for m in metrics] == [1, 2, 3]
        assert any(m.groups_used > 0 for m in metrics), "a warm model must have groups with signal"
        assert any(not torch.equal(before[k], v) for k, v in weights(trainer).items())
        assert [r.round for r in ledger.rounds()] == [1, 2, 3]
        assert trainer.policy.version == 3


def test_resume_from_a_checkpoint_reproduces_the_uninterrupted_run(quick_model: Path, tmp_path: Path) -> None:
    cfg = config()
    with Ledger(tmp_path / "a" / "ledger.sqlite") as ledger:
        straight = make_trainer(quick_model, tmp_path / "a", cfg, ledger)
        for _ in range(4):
            straight.run_round()
    (tmp_path / "b").mkdir()
    with Ledger(tmp_path / "b" / "ledger.sqlite") as ledger:
        first = make_trainer(quick_model, tmp_path / "b", cfg, ledger)
        for _ in range(3):  # checkpoint at round 2, then round 3 is lost with the "crash"
            first.run_round()
    with Ledger(tmp_path / "b" / "ledger.sqlite") as ledger:
        second = make_trainer(quick_model, tmp_path / "b", cfg, ledger)
        assert second.resume()
        assert second.round == 2 and ledger.last_round() == 2  # round 3 is redone
        for _ in range(2):
            second.run_round()
        a, b = weights(straight), weights(second)
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert [r.round for r in ledger.rounds()] == [1, 2, 3, 4]


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
    quick_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path, config(), ledger)
        for _ in range(4):
            trainer.run_round()
    newest = CheckpointStore(tmp_path / "ckpt").paths()[-1]
    weights_file = newest / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:100])  # truncated
    with Ledger(tmp_path / "ledger.sqlite") as ledger, caplog.at_level(logging.WARNING):
        resumed = make_trainer(quick_model, tmp_path, config(), ledger)
        assert resumed.resume()
        assert resumed.round == 2
    assert newest.name in caplog.text


def test_external_groups_are_mixed_per_sapo(quick_model: Path, tmp_path: Path) -> None:
    cfg = config(**{"swarm.mixing": "sapo", "swarm.local_groups": 2, "swarm.external_groups": 3})
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path, cfg, ledger)
        own, _, _ = trainer.generate_groups(1)
        external = [relabelled(g, [1.0, 0.0, 0.0, 0.0]) for g in own[:5]]
        flat = [relabelled(g, [0.0] * 4) for g in own[:5]]
        local, ext = trainer.choose_groups(own, [*external, *flat])
        assert len(ext) == 3
        assert not any(zero_advantage(g.rewards) for g in ext)  # zero-advantage groups never chosen
        assert len(local) <= 2
        metrics = trainer.train_round(own, [*external, *flat])
        assert metrics.external_used == 3


@pytest.mark.parametrize("mixing", ["sapo", "hacpo"])
@pytest.mark.parametrize("steps", [1, 3])
def test_external_rows_old_logprobs_from_the_first_step_equal_a_pass_of_their_own(
    quick_model: Path, tmp_path: Path, steps: int, mixing: str
) -> None:
    """The first step's log-probs are the policy before the update, so the external rows' old
    log-probs (and HACPO's per-response old means) are taken from them: the update is the same
    as with a separate no-grad pass."""
    cfg = config(
        **{"swarm.mixing": mixing, "swarm.local_groups": 4, "swarm.external_groups": 4},
        **{"learn.updates_per_round": steps},
    )
    results = []
    for separate in (False, True):
        with Ledger(tmp_path / f"ledger-{separate}.sqlite") as ledger:
            trainer = make_trainer(quick_model, tmp_path / str(separate), cfg, ledger)
            trainer.generator.manual_seed(5)
            own, _, _ = trainer.generate_groups(1)
            external = [relabelled(g, [1.0, 0.0, 1.0, 0.0], source_mean_logprobs=[-0.5] * 4) for g in own[:4]]
            if separate:  # the previous way: a no-grad forward of every row of its own

                def separate_pass(
                    g: list[ScoredGroup], current: torch.Tensor, t: Trainer = trainer
                ) -> torch.Tensor:
                    with torch.no_grad():
                        ours, _ = completion_logprobs(
                            t.policy.model,
                            [x.prompt_ids for x in g for _ in range(x.size)],
                            [c for x in g for c in x.completion_ids],
                            cfg.rollout.temperature,
                            t.policy.pad_token_id,
                            shared_prefix=cfg.learn.shared_prefix,
                        )
                    return Trainer._old_logprobs(t, g, current=ours)

                trainer._old_logprobs = separate_pass  # type: ignore[method-assign]
            forwards: list[int] = []
            decoder = trainer.policy.model.get_decoder()  # type: ignore[operator]
            hook = decoder.register_forward_hook(lambda *_, seen=forwards: seen.append(1))
            metrics = trainer.train_round(own, external)
            hook.remove()
            assert metrics.external_used == 4
            assert len(forwards) == steps + separate  # one forward per step, none of its own
            results.append((metrics.loss, weights(trainer)))
    (loss_a, a), (loss_b, b) = results
    assert loss_a == loss_b
    for name in a:
        assert torch.equal(a[name], b[name]), name  # the same forward, bit for bit


def gradients_at_each_step(trainer: Trainer) -> list[dict[str, torch.Tensor]]:
    """A list that fills with every parameter's gradient at each optimizer step of ``trainer``."""
    seen: list[dict[str, torch.Tensor]] = []
    step = trainer.optimizer.step

    def recording_step(*args: object, **kwargs: object) -> object:
        seen.append(
            {n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.grad is not None}
        )
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step  # type: ignore[method-assign]
    return seen


def every_row(advantages: torch.Tensor, *, every_row: bool) -> list[int]:
    """``Trainer._rows_to_score`` as before rows with advantage 0 were skipped: every row."""
    return list(range(len(advantages)))


def seeded_trainer(
    model: Path, tmp_path: Path, cfg: Config, ledger: Ledger, *, skip: bool, seed: int
) -> tuple[Trainer, list[ScoredGroup]]:
    """A trainer and one round of its groups, the same for the same seed; ``skip=False``: it runs
    every row through the model (``every_row``)."""
    trainer = make_trainer(model, tmp_path / str(skip), cfg, ledger)
    torch.manual_seed(seed)
    trainer.generator.manual_seed(seed)
    trainer.mixing_rng.seed(seed)
    own, _, _ = trainer.generate_groups(1)
    if not skip:
        trainer._rows_to_score = every_row  # type: ignore[method-assign]
    return trainer, own


@pytest.mark.parametrize(
    ("overrides", "steps"),
    [
        ({"swarm.mixing": "hacpo"}, 1),
        ({"swarm.mixing": "hacpo"}, 3),
        ({"swarm.mixing": "hacpo", "learn.micro_batch_tokens": 48}, 2),
        ({"swarm.mixing": "none", "learn.drop_zero_advantage": False}, 1),
        ({"swarm.mixing": "none", "learn.drop_zero_advantage": False, "learn.algorithm": "dapo"}, 1),
        ({"swarm.mixing": "none", "learn.drop_zero_advantage": False, "learn.algorithm": "gspo"}, 2),
    ],
)
def test_rows_with_advantage_zero_are_not_run_and_the_update_is_the_same(
    quick_model: Path, tmp_path: Path, overrides: dict[str, object], steps: int
) -> None:
    """Every loss is A times a finite ratio per row: rows with A = 0 change nothing, so the update
    skips them (HACPO trains on every own group, all-equal ones too) and ends where a forward and
    backward of every row would, up to float rounding."""
    cfg = config(**overrides, **{"learn.updates_per_round": steps, "swarm.external_groups": 4})
    results = []
    for skip in (True, False):
        with Ledger(tmp_path / f"ledger-{skip}.sqlite") as ledger:
            trainer, own = seeded_trainer(quick_model, tmp_path, cfg, ledger, skip=skip, seed=3)
            # Half of our groups all wrong (A = 0 for each row), the rest with signal.
            own = [
                dataclasses.replace(g, rewards=[0.0] * g.size if i % 2 else [1.0, 0.0, 1.0, 0.0])
                for i, g in enumerate(own)
            ]
            external = [relabelled(g, [1.0, 1.0, 0.0, 1.0], source_mean_logprobs=[-0.5] * 4) for g in own[:4]]
            before = weights(trainer)
            steps_seen = gradients_at_each_step(trainer)
            metrics = trainer.train_round(own, external)
            results.append((metrics.loss, trainer.last_scored_rows, steps_seen, weights(trainer)))
    (loss_a, rows_a, grads_a, a), (loss_b, rows_b, grads_b, b) = results
    assert rows_a < rows_b  # rows were skipped
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    assert any(not torch.equal(before[k], v) for k, v in a.items())  # it trained
    assert len(grads_a) == len(grads_b) == steps
    for step, (step_a, step_b) in enumerate(zip(grads_a, grads_b, strict=True)):
        # float32 sums in another order: the first step within 1e-5 of the tensor's largest entry
        # (measured up to 1.1e-6). Each AdamW step turns that rounding into weight differences up to
        # ~lr on entries with tiny gradients, so later steps' gradients part further (measured
        # 3.4e-6 at the second step, 2.4e-5 at the third on an AVX-512 machine): 1e-4 per step
        # after the first. Running the skipped rows wrongly moves gradients by O(1) of the scale.
        tolerance = 1e-5 if step == 0 else 1e-4 * step
        for name, grad in step_a.items():
            scale = float(step_b[name].abs().max())
            error = float((grad - step_b[name]).abs().max())
            assert error <= tolerance * scale + 1e-12, (step, name, error, scale)
    for name in a:  # Adam divides by sqrt(v): a ~1e-9 gradient's rounding moves its weight ~1e-6
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-5, msg=name)


def test_an_update_in_which_every_advantage_is_zero_steps_adamw_on_zero_gradients(
    quick_model: Path, tmp_path: Path
) -> None:
    """No row has signal: no forward runs, yet AdamW steps on zero gradients (its momentum moves
    the weights) exactly as after a forward and backward of every row."""
    cfg = config(**{"swarm.mixing": "none", "learn.drop_zero_advantage": False})
    results = []
    for skip in (True, False):
        with Ledger(tmp_path / f"ledger-{skip}.sqlite") as ledger:
            trainer, own = seeded_trainer(quick_model, tmp_path, cfg, ledger, skip=skip, seed=4)
            signal = [dataclasses.replace(g, rewards=[1.0, 0.0, 0.0, 0.0]) for g in own]
            flat = [dataclasses.replace(g, rewards=[0.0] * g.size) for g in own]
            trainer.update(signal)  # AdamW's moments are not zero from here on
            after_first = weights(trainer)
            steps_seen = gradients_at_each_step(trainer)
            loss, _, _ = trainer.update(flat)
            results.append((loss, trainer.last_scored_rows, steps_seen, after_first, weights(trainer)))
    (loss_a, rows_a, grads_a, first_a, a), (loss_b, rows_b, grads_b, _, b) = results
    assert rows_a == 0 and rows_b == len(own) * 4
    assert loss_a == 0.0 and loss_b == pytest.approx(0.0, abs=1e-9)
    assert len(grads_a) == len(grads_b) == 1  # both stepped once
    assert grads_a[0].keys() == grads_b[0].keys()
    for name, grad in grads_a[0].items():
        assert not grad.any() and not grads_b[0][name].any(), name
    assert any(not torch.equal(first_a[k], v) for k, v in a.items())  # the momentum moved them
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


def test_hacpo_mixing_trains_on_external_groups(quick_model: Path, tmp_path: Path) -> None:
    cfg = config(**{"swarm.mixing": "hacpo", "swarm.external_groups": 2})
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path, cfg, ledger)
        own, _, _ = trainer.generate_groups(1)
        external = [
            relabelled(g, [1.0, 1.0, 0.0, 0.0], source_mean_logprobs=[-0.5] * 4, source_reward_mean=0.99)
            for g in own  # the peer answers our prompts, as every HACPO agent does
        ]
        before = weights(trainer)
        metrics = trainer.train_round(own, external)
        assert metrics.external_used == 2
        # Capability comes from our own scores of the peer's groups (mean 0.5), not its claimed 0.99.
        assert trainer.capabilities.capability("peer") == pytest.approx(0.5)
        assert any(not torch.equal(before[k], v) for k, v in weights(trainer).items())


def test_hacpo_takes_no_external_group_whose_joint_group_with_ours_has_no_signal(
    quick_model: Path, tmp_path: Path
) -> None:
    # Red team rt67 F1: a peer's solved group beside our solved group trains nothing, yet took a
    # place (32% of them on honest traffic) and counted in its sender's capability (its other
    # rows then weighed 3.4x an honest peer's same rows).
    with rule_trainer(quick_model, tmp_path, "hacpo", 4, 8) as (trainer, own):
        solved, failed = (
            dataclasses.replace(own[0], rewards=[1.0] * 4),
            dataclasses.replace(own[1], rewards=[0.0] * 4),
        )
        beside_solved = dataclasses.replace(relabelled(solved, [1.0] * 4), texts=["a"] * 4)
        beside_failed = dataclasses.replace(relabelled(failed, [1.0] * 4), texts=["b"] * 4)
        elsewhere = regenerate(dataclasses.replace(own[0].task.id, seed=own[0].task.id.seed + 10**6))
        mixed_elsewhere = dataclasses.replace(relabelled(solved, [1.0, 0.0, 0.0, 0.0]), task=elsewhere)
        _, ext = trainer.choose_groups([solved, failed], [beside_solved, beside_failed, mixed_elsewhere])
        assert sorted(g.texts[0] for g in ext) == sorted(["b", mixed_elsewhere.texts[0]])
        trainer.update([solved, failed], [beside_solved])
        assert trainer.capabilities.capability("peer") is None  # nothing of it trained: no sample


def test_a_peers_group_beside_ours_is_a_candidate_only_with_a_success_ours_lacks(
    quick_model: Path, tmp_path: Path
) -> None:
    # Red team rt68 F2: a peer's all-wrong group beside our all-correct one has a joint signal,
    # but teaches nothing: it made our solved rows' advantage non-zero (HACPO's update 2.8-3.0x
    # the CPU) and, under the joint rule, put our solved groups in our signal groups' places.
    for rule in ("hacpo", "joint"):
        with rule_trainer(quick_model, tmp_path / rule, rule, 4, 8) as (trainer, own):
            solved = dataclasses.replace(own[0], rewards=[1.0] * 4)
            mixed = dataclasses.replace(own[1], rewards=[1.0, 0.0, 1.0, 0.0])
            failed = dataclasses.replace(own[2], rewards=[0.0] * 4)
            junk = [
                dataclasses.replace(relabelled(g, [0.0] * 4), texts=[f"junk {i}"] * 4)
                for i, g in enumerate((solved, mixed, failed))
            ]
            teaching = [
                dataclasses.replace(relabelled(g, [1.0, 0.0, 0.0, 0.0]), texts=[f"teach {i}"] * 4)
                for i, g in enumerate((mixed, failed))
            ]
            local, ext = trainer.choose_groups([solved, mixed, failed], [*junk, *teaching])
            assert sorted(g.texts[0] for g in ext) == ["teach 0", "teach 1"]
            if rule == "joint":
                assert solved not in local  # no junk beside it: not put first


def test_hacpo_samples_a_peers_capability_over_the_groups_of_it_the_step_trains_on(
    quick_model: Path, tmp_path: Path
) -> None:
    # Red teams rt63 F5, rt64 F1, rt65 F1/F2, rt66 F1: counted over other groups than those
    # trained, padding (solved groups elsewhere, copies, a solved group first beside weak ones)
    # raised the weight of a peer's trained rows; sampled on our prompts only, peers sending
    # under other ids of our questions, or answering fewer prompts, were mis-weighted.
    with rule_trainer(quick_model, tmp_path, "hacpo", 4, 8) as (trainer, own):

        def sent(source: str, groups: list[ScoredGroup], rewards: list[float]) -> list[ScoredGroup]:
            return [
                dataclasses.replace(relabelled(g, rewards), source=source, texts=[f"{source} {i}"] * g.size)
                for i, g in enumerate(groups)  # each its own text: distinct() keeps one copy of a text
            ]

        elsewhere = regenerate(dataclasses.replace(own[0].task.id, seed=own[0].task.id.seed + 10**6))
        aliases = [dataclasses.replace(g, task=regenerate(shifted(g.task.id, 3))) for g in own]
        gamer = [
            *sent("gamer", [dataclasses.replace(own[0], task=elsewhere)] * 30, [1.0] * 4),  # never trained
            *sent("gamer", own, [1.0] * 4),  # a solved group first on each of our tasks...
            *sent("gamer", own * 3, [1.0, 0.0, 0.0, 0.0]),  # ...then weak ones on them
        ]
        dodger = sent("dodger", aliases, [1.0, 0.0, 0.0, 0.0])
        fewer = sent("fewer", own[:4], [1.0, 1.0, 1.0, 0.0])
        chosen: list[ScoredGroup] = []
        choose = trainer.choose_groups

        def recording(own: Sequence[ScoredGroup], external: Sequence[ScoredGroup]) -> Any:
            local, ext = choose(own, external)
            chosen[:] = ext
            return local, ext

        trainer.choose_groups = recording  # type: ignore[method-assign]
        trainer.update(own, [*gamer, *dodger, *fewer])
        by_source: dict[str, list[float]] = {}
        for g in chosen:
            by_source.setdefault(g.source, []).extend(g.rewards)
        assert set(by_source) == {"gamer", "dodger", "fewer"}  # each has groups trained
        for source, rewards in by_source.items():
            assert trainer.capabilities.capability(source) == pytest.approx(statistics.fmean(rewards)), source
        assert trainer.capabilities.capability("fewer") == pytest.approx(0.75)
        assert trainer.capabilities.capability("dodger") == pytest.approx(0.25)


def test_own_groups_older_than_the_policy_train_with_m2po_and_fresh_ones_do_not(
    quick_model: Path, tmp_path: Path
) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path, config(), ledger)
        torch.manual_seed(0)
        groups, _, _ = trainer.generate_groups(1)
        trainer.update(groups)
        assert trainer.last_step_stale is False  # generated by the current version
        trainer.policy.version += 3  # the learner moved on; the same groups are now 3 versions old
        before = weights(trainer)
        trainer.update(groups)
        assert trainer.last_step_stale is True
        assert 0.0 <= trainer.last_m2po_masked <= 1.0
        assert any(not torch.equal(before[k], v) for k, v in weights(trainer).items())


def test_stale_loss_same_keeps_the_configured_loss_for_stale_groups(
    quick_model: Path, tmp_path: Path
) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path, config(**{"learn.stale_loss": "same"}), ledger)
        groups, _, _ = trainer.generate_groups(1)
        trainer.policy.version += 3
        trainer.update(groups)
        assert trainer.last_step_stale is False


@contextmanager
def rule_trainer(
    quick_model: Path, tmp_path: Path, mixing: str, local: int, external: int
) -> Iterator[tuple[Trainer, list[ScoredGroup]]]:
    """A trainer on ``swarm.mixing = mixing`` with I = ``local``, J = ``external``, and one round of
    its own groups."""
    cfg = config(**{"swarm.mixing": mixing, "swarm.local_groups": local, "swarm.external_groups": external})
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path, cfg, ledger)
        own, _, _ = trainer.generate_groups(1)
        yield trainer, own


def test_the_receiver_baseline_rule_trains_on_a_peers_all_correct_group_with_r_minus_our_rate(
    quick_model: Path, tmp_path: Path
) -> None:
    # One update of plain GRPO (lr, one step, old = ours: ratio 1) on the chosen rows with the
    # rule's advantages: the loss is -mean over rows of A_i * mean_t(ratio) = -mean(A).
    with rule_trainer(quick_model, tmp_path, "receiver_baseline", 0, 1) as (trainer, own):
        own = [dataclasses.replace(g, rewards=[1.0, 0.0, 0.0, 0.0]) for g in own]  # we solve 25%
        demo = relabelled(own[0], [1.0, 1.0, 1.0, 1.0])  # SAPO would drop it: zero advantage
        wrong = relabelled(own[1], [0.0, 0.0, 0.0, 0.0])  # teaches nothing: never chosen
        loss, used_own, used_ext = trainer.update(own, [wrong, demo])
        assert list(trainer.family_baseline.state_dict().values()) == [0.25]  # b_f from own groups
        assert (used_own, used_ext) == (0, 1)
        assert trainer.choose_groups(own, [wrong, demo])[1] == [demo]
        assert loss == pytest.approx(-(1.0 - 0.25), abs=1e-5)


@pytest.mark.parametrize("mixing", ["receiver_baseline", "sapo", "hacpo"])
def test_a_peers_group_counts_for_no_more_completions_than_ours(
    quick_model: Path, tmp_path: Path, mixing: str
) -> None:
    # Red team rt33 F1: the wire allows 64 completions a group; a peer's 64 were worth 8 of our
    # groups in selection and loss, took every external place and cost 5x our update's CPU.
    with rule_trainer(quick_model, tmp_path, mixing, 1, 1) as (trainer, own):
        own = [dataclasses.replace(g, rewards=[0.0, 1.0, 0.0, 0.0]) for g in own]
        g = own[0]
        big = dataclasses.replace(
            relabelled(g, [1.0, 0.0] * 32),
            completion_ids=[g.completion_ids[i % 4] for i in range(64)],
            texts=[g.texts[i % 4] for i in range(64)],
            source_mean_logprobs=[-1.0] * 64,
        )
        _, ext = trainer.choose_groups(own, [big])
        assert [e.size for e in ext] == [4]  # rollout.group_size
        assert ext[0].rewards == [1.0, 0.0, 1.0, 0.0] and ext[0].texts == g.texts
        # Red team rt35 F3: copies (from other signers, or differing only past our group size)
        # are one group: they would fill every external place.
        copy = dataclasses.replace(big, source="sybil", texts=[*big.texts[:63], "other"])
        assert distinct([big.first(4), copy.first(4)]) == [big.first(4)]
        # rt61 F1b: nor under a renamed task id, (seed + k, index - k): the same question
        renamed = dataclasses.replace(big, task=regenerate(shifted(big.task.id, 3)))
        assert renamed.task.prompt == big.task.prompt
        assert distinct([big.first(4), renamed.first(4)]) == [big.first(4)]
    with rule_trainer(quick_model, tmp_path / "j2", mixing, 1, 2) as (trainer, own):
        own = [dataclasses.replace(g, rewards=[0.0, 1.0, 0.0, 0.0]) for g in own]
        _, ext = trainer.choose_groups(own, [big, copy])
        assert len(ext) == 1  # J = 2, but one group to train on


def test_the_anchored_rule_replays_our_all_correct_group_with_advantage_one_beside_the_peers_demo(
    quick_model: Path, tmp_path: Path
) -> None:
    with rule_trainer(quick_model, tmp_path, "anchored", 1, 1) as (trainer, own):
        own = [dataclasses.replace(g, rewards=[1.0] * 4 if i == 0 else [0.0] * 4) for i, g in enumerate(own)]
        demo = relabelled(own[1], [1.0] * 4)  # we solve 4/32 = 12.5%: the peer's rows get 0.875
        local, ext = trainer.choose_groups(own, [demo])
        assert local == [own[0]] and ext == [demo]  # SAPO's filter would leave no own group at all
        loss, used_own, used_ext = trainer.update(own, [demo])
        assert (used_own, used_ext) == (1, 1)
        assert loss == pytest.approx(-(4 * 1.0 + 4 * 0.875) / 8, abs=1e-5)  # ratio 1: -mean(A)


def test_the_replay_rule_trains_on_a_peers_success_remembered_from_an_earlier_round_with_one_minus_our_rate(
    quick_model: Path, tmp_path: Path
) -> None:
    with rule_trainer(quick_model, tmp_path, "replay", 1, 1) as (trainer, own):
        wrong = [dataclasses.replace(g, rewards=[0.0] * 4) for g in own]  # we solve nothing: b_f = 0
        answer = own[1].task.entry["answer"]
        eos = trainer.policy.eos_token_id
        # Red team rt51 F3, rt52 F3: full reward for "0" + the answer or the answer padded with
        # spaces (a scorer's leniency), or cut at the token cap, but replay would teach that; only
        # an ended success spelling the answer as the task does is remembered.
        rows = [  # (text, ids): each has full reward
            (f"0{answer}", [5, 6, eos]),  # another spelling
            (f" {answer}\n", [5, 7, eos]),  # padded
            (answer, [5, 8]),  # cut at the cap, no EOS
            (answer, [5, 9, eos]),  # the one remembered
        ]
        spelt = dataclasses.replace(own[1], texts=[t for t, _ in rows], completion_ids=[i for _, i in rows])
        demo = relabelled(spelt, [1.0, 1.0, 1.0, 1.0])
        loss, _, used_ext = trainer.update(wrong, [demo])
        assert used_ext == 1 and trainer.last_replayed == 0  # nothing remembered before this round
        assert trainer.demo_memory.families() == {family_of(demo.task): 1}  # its first success only
        # Next round the peer sends nothing and our groups teach nothing: the remembered success is
        # the one row, a one-completion group with A = S - b_f = 1 - 0.
        loss, used_own, used_ext = trainer.update(wrong, [])
        assert (used_own, used_ext, trainer.last_replayed) == (0, 0, 1)
        assert trainer.last_replayed_sources == {"peer": 1}  # the dashboard's "replayed" (rt60 L4)
        assert loss == pytest.approx(-1.0, abs=1e-5)  # ratio 1: -mean(A)
        [replayed] = trainer._replayed()
        assert replayed.completion_ids == [demo.completion_ids[3]] and replayed.rewards == [1.0]
        # rt59 F1: the text is not kept (a sender sizes it); the replayed row's is our decoding of its ids
        assert replayed.texts == [trainer.policy.decode_completion(demo.completion_ids[3])]
        assert not hasattr(
            trainer.demo_memory.sample(1, {family_of(demo.task): 1.0}, random.Random(0))[0][0], "text"
        )
    # Red team rt51 F2: a peer's group on one of our held-out tasks is neither trained on nor
    # remembered (the held-out seed is public).
    (tmp_path / "heldout").mkdir()
    with rule_trainer(quick_model, tmp_path / "heldout", "replay", 1, 1) as (trainer, own):
        wrong = [dataclasses.replace(g, rewards=[0.0] * 4) for g in own]
        spelt = [own[1].task.entry["answer"]] * 4
        probe = relabelled(dataclasses.replace(own[1], texts=spelt), [0.0, 1.0, 1.0, 0.0])
        on_heldout = dataclasses.replace(probe, task=trainer.heldout[0])
        assert trainer.update(wrong, [on_heldout])[2] == 0 and len(trainer.demo_memory) == 0
        # rt61 F1: nor under another id that regenerates it, (seed + k, index - k)
        for k in (1, 1000):
            renamed = dataclasses.replace(probe, task=regenerate(shifted(trainer.heldout[0].id, k)))
            assert renamed.task.prompt == trainer.heldout[0].prompt
            assert trainer.update(wrong, [renamed])[2] == 0 and len(trainer.demo_memory) == 0
        assert (
            trainer.update(wrong, [probe])[2] == 1 and len(trainer.demo_memory) == 1
        )  # the same, not held out
    (tmp_path / "anchored").mkdir()
    with rule_trainer(quick_model, tmp_path / "anchored", "anchored", 1, 1) as (trainer, own):
        wrong = [dataclasses.replace(g, rewards=[0.0] * 4) for g in own]
        trainer.update(wrong, [relabelled(own[1], [0.0, 1.0, 1.0, 0.0])])
        assert trainer.update(wrong, [])[1:] == (0, 0) and len(trainer.demo_memory) == 0  # no memory


@pytest.mark.parametrize("mixing", ["sapo", "hacpo", "joint"])
def test_one_sender_of_many_groups_takes_no_more_external_places_than_another(
    quick_model: Path, tmp_path: Path, mixing: str
) -> None:
    """Red team rt63 F1: drawn uniformly over groups, one identity sending 400 groups a round
    against 7 honest peers' 16 each took 78% of the J places (SAPO, HACPO, joint alike)."""
    with rule_trainer(quick_model, tmp_path, mixing, 4, 4) as (trainer, own):

        def sent(source: str, n: int) -> list[ScoredGroup]:
            return [
                dataclasses.replace(
                    relabelled(own[i % len(own)], [1.0, 0.0, 1.0, 0.0]),
                    source=source,
                    texts=[f"{source} {i} {j}" for j in range(4)],  # all distinct
                )
                for i in range(n)
            ]

        honest = [g for p in range(7) for g in sent(f"honest-{p}", 2)]
        taken: Counter[str] = Counter()
        for _ in range(200):
            _, ext = trainer.choose_groups(own, [*honest, *sent("attacker", 40)])
            assert len(ext) == 4
            taken.update(g.source for g in ext)
        assert taken["attacker"] / 800 < 0.2  # 1/8 expected; a uniform draw over groups: 40/54


def test_a_group_of_our_own_on_a_held_out_task_is_not_trained_on(quick_model: Path, tmp_path: Path) -> None:
    """Red team rt63 F3: a learner's "own" groups are its workers', and a worker chooses its task
    ids: one on a held-out task (its seed is public) was trained on, inflating held-out accuracy."""
    with rule_trainer(quick_model, tmp_path, "sapo", 4, 4) as (trainer, own):
        before = weights(trainer)
        on_heldout = dataclasses.replace(own[1], task=trainer.heldout[0], rewards=[0.0, 1.0, 1.0, 0.0])
        renamed = dataclasses.replace(on_heldout, task=regenerate(shifted(trainer.heldout[0].id, 7)))
        assert trainer.update([on_heldout, renamed], [])[1] == 0
        assert all(torch.equal(before[k], v) for k, v in weights(trainer).items())
        elsewhere = dataclasses.replace(on_heldout, task=own[1].task)
        assert trainer.update([elsewhere], [])[1] == 1  # the same group on a training task


def test_replays_memory_keeps_token_ids_as_4_byte_arrays(quick_model: Path, tmp_path: Path) -> None:
    # Red team rt58 F2: each answer was kept as a one-completion ScoredGroup, token ids as Python
    # ints (about 36 bytes a token): 19.6 KiB an entry for a 200-token prompt and a 256-token
    # completion, and peers fill all 8,192 answers a family at swarm.replay_memory = 1,024.
    # rt59 F1: its text, which nothing at replay reads, is the sender's to size: 4 bytes a
    # character with one outside Latin-1 (16 KiB an answer); it is decoded at replay instead.
    with rule_trainer(quick_model, tmp_path, "replay", 1, 1) as (trainer, own):
        eos = trainer.policy.eos_token_id
        answer = own[1].task.entry["answer"]

        def sent_by(peer: int) -> ScoredGroup:  # fresh lists, as each peer's group is decoded anew
            return dataclasses.replace(
                relabelled(own[1], [1.0, 0.0, 0.0, 0.0]),
                prompt_ids=[1000 + t for t in range(200)],
                completion_ids=[[2000 + t for t in range(255)] + [eos] for _ in range(4)],
                texts=["\N{SLIGHTLY SMILING FACE}" * 4000 + f"<answer>{answer}</answer>"] * 4,
                source=f"peer{peer}",
            )

        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for peer in range(8):
            trainer._remember_demos([sent_by(peer)])
        gc.collect()
        kept = (tracemalloc.get_traced_memory()[0] - before) / 8
        tracemalloc.stop()
        assert trainer.demo_memory.families() == {family_of(own[1].task): 1}
        assert len(trainer.demo_memory) == 1 and trainer.demo_memory.senders(family_of(own[1].task)) == {
            f"peer{p}": 1 for p in range(8)
        }
        assert kept < 4 * 1024  # 456 tokens: 1.8 KiB as 4-byte ids (16.4 KiB as Python ints)
        replayed = trainer._replayed()[0]  # rebuilt as a one-completion group
        assert replayed.prompt_ids == [1000 + t for t in range(200)]
        assert replayed.completion_ids == [[2000 + t for t in range(255)] + [eos]]


def test_the_positive_only_rule_ignores_a_peers_errors_and_joint_needs_our_group_on_the_prompt(
    quick_model: Path, tmp_path: Path
) -> None:
    cfg = config(**{"swarm.mixing": "positive_only", "swarm.local_groups": 0, "swarm.external_groups": 2})
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path, cfg, ledger)
        own, _, _ = trainer.generate_groups(1)
        own = [dataclasses.replace(g, rewards=[0.0] * 4) for g in own]  # we solve nothing: b_f = 0
        mixed = relabelled(own[0], [1.0, 0.0, 0.0, 0.0])
        loss, _, used_ext = trainer.update(own, [mixed])
        assert used_ext == 1
        assert loss == pytest.approx(-(1.0 + 0 + 0 + 0) / 4, abs=1e-5)  # errors weigh 0, not -b
    cfg = config(**{"swarm.mixing": "joint", "swarm.local_groups": 1, "swarm.external_groups": 1})
    with Ledger(tmp_path / "ledger2.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path / "j", cfg, ledger)
        own, _, _ = trainer.generate_groups(1)
        own = [dataclasses.replace(g, rewards=[0.0] * 4) for g in own]
        on_our_prompt = relabelled(own[2], [1.0] * 4)
        local, ext = trainer.choose_groups(own, [on_our_prompt])
        assert ext == [on_our_prompt] and local == [own[2]]  # the joint group: ours and the peer's
        loss, used_own, used_ext = trainer.update(own, [on_our_prompt])
        assert (used_own, used_ext) == (1, 1)
        assert loss == pytest.approx(0.0, abs=1e-5)  # +a on the peer's rows, -a on ours: mean 0
