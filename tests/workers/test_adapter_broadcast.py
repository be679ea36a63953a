"""Adapter versions (SPEC 1.5): a learner that trains LoRA adapters broadcasts the adapter alone.

Specifications:
- a worker holding the learner's base ends up with exactly the learner's merged weights, bit for
  bit, from a blob of the adapter alone, and so does the learner's spot-check copy;
- weights a later adapter no longer names go back to their base, exactly;
- an adapter for another base, or one that does not fit the model, is refused before anything is
  loaded, naming what is wrong; a worker that has installed whole weights since it started refuses
  adapters (it no longer holds the base);
- the base's identity (``weights_hash``) covers names, dtypes, shapes and bytes;
- on the wire: a learner's adapter manifest is refused by a worker of another base (``base_mismatch``)
  and installed by one of the same base; the manifest fields are checked at decode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from swarmnode.broadcast.adapter import BaseWeights, adapter_layout, weights_hash
from swarmnode.broadcast.driver import (
    BroadcastError,
    blob_to_state_dict,
    build_manifest,
    state_dict_to_blob,
)
from swarmnode.broadcast.weights import WeightPublisher, WeightReceiver
from swarmnode.net.dataplane import DataPlane, PeerRefused
from swarmnode.ops.metrics import Metrics
from swarmnode.policy import build_tiny_policy
from swarmnode.policy.lora import (
    apply_lora,
    base_state_dict,
    broadcast_adapter,
    merged_state_dict,
    plain_copy,
)
from swarmnode.rollout import make_engine
from swarmnode.wire import PeerRecord
from swarmnode.wire import swarm_pb2 as pb
from swarmnode.wire.messages import WeightManifestBody, decode_manifest_body, encode_manifest_body
from swarmnode.wire.reasons import WireError
from tests.workers.test_weights import identity, until

TARGETS = ["q_proj", "v_proj", "down_proj"]


def lora_model(
    seed: int = 1, targets: list[str] | None = None, rank: int = 4, trained: int = 0
) -> torch.nn.Module:
    """The tiny model of ``seed`` with adapters whose B is not zero (as after training)."""
    model = apply_lora(build_tiny_policy(seed).model, rank, 8.0, targets or TARGETS)
    train_adapters(model, trained)
    return model


def train_adapters(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


def same(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_worker_of_the_same_base_gets_the_learners_merged_weights_bit_for_bit() -> None:
    learner = lora_model()
    adapter, scale = broadcast_adapter(learner)
    assert scale == 2.0  # alpha / r = 8 / 4
    assert sorted(adapter)[:2] == [
        "model.layers.0.mlp.down_proj.lora_A.weight",
        "model.layers.0.mlp.down_proj.lora_B.weight",
    ]
    worker = build_tiny_policy(1).model  # the base, as a worker loads it
    base = BaseWeights(worker)
    assert base.hash == weights_hash(base_state_dict(learner))
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    whole_bytes = sum(t.numel() * t.element_size() for t in merged_state_dict(learner).values())
    assert adapter_bytes < whole_bytes / 5
    base.install_adapter(adapter, base.hash, scale)
    assert same(worker.state_dict(), merged_state_dict(learner))
    # The learner's spot-check copy, given the live model's frozen base (no copy taken), agrees too.
    scratch = build_tiny_policy(1).model
    BaseWeights(scratch, base_state_dict(learner)).install_adapter(adapter, base.hash, scale)
    assert same(scratch.state_dict(), merged_state_dict(learner))


def test_weights_a_later_adapter_does_not_name_go_back_to_their_base() -> None:
    worker = build_tiny_policy(1).model
    pristine = {k: v.clone() for k, v in worker.state_dict().items()}
    base = BaseWeights(worker)
    wide = lora_model(targets=["q_proj", "v_proj"])
    base.install_adapter(*broadcast_adapter(wide)[:1], base.hash, broadcast_adapter(wide)[1])
    narrow = lora_model(targets=["q_proj"], trained=3)
    adapter, scale = broadcast_adapter(narrow)
    base.install_adapter(adapter, base.hash, scale)
    assert same(worker.state_dict(), merged_state_dict(narrow))
    v_proj = [k for k in pristine if k.endswith("v_proj.weight")]
    assert v_proj and all(torch.equal(worker.state_dict()[k], pristine[k]) for k in v_proj)


def test_an_adapter_for_another_base_is_refused_and_nothing_is_loaded() -> None:
    learner = lora_model()
    adapter, scale = broadcast_adapter(learner)
    worker = build_tiny_policy(2).model  # another base
    before = {k: v.clone() for k, v in worker.state_dict().items()}
    base = BaseWeights(worker)
    with pytest.raises(BroadcastError, match=r"adapter for base .* but this model's is"):
        base.install_adapter(adapter, weights_hash(base_state_dict(learner)), scale)
    assert same(worker.state_dict(), before)


def test_after_whole_weights_a_worker_refuses_adapters_until_it_restarts() -> None:
    worker = build_tiny_policy(1).model
    base = BaseWeights(worker)
    first_hash = base.hash
    blob, tensors = state_dict_to_blob(build_tiny_policy(5).model.state_dict())
    base.install_whole(blob, tensors)
    assert base.hash == first_hash  # still the base it was loaded with
    adapter, scale = broadcast_adapter(lora_model())
    with pytest.raises(BroadcastError, match="restart"):
        base.install_adapter(adapter, first_hash, scale)


def test_the_hash_of_a_base_sees_every_byte_name_dtype_and_shape() -> None:
    state = {k: v.clone() for k, v in build_tiny_policy(1).model.state_dict().items()}
    reference = weights_hash(state)
    assert weights_hash({k: v.clone() for k, v in state.items()}) == reference
    name = "model.norm.weight"
    changed = {**state, name: state[name].clone()}
    changed[name].view(torch.int32)[0] ^= 1  # one bit
    assert weights_hash(changed) != reference
    assert weights_hash({**state, name: state[name].double()}) != reference
    assert weights_hash({**state, name: state[name].reshape(1, -1)}) != reference
    renamed = {("model.norm.other" if k == name else k): v for k, v in state.items()}
    assert weights_hash(renamed) != reference


def layout_of(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda a: {**a, "model.norm.weight": torch.zeros(64)}, "neither"),
        (lambda a: {k: v for k, v in a.items() if not k.endswith("q_proj.lora_B.weight")}, "lacks its"),
        (
            lambda a: {
                **a,
                "model.nowhere.lora_A.weight": torch.zeros(4, 64),
                "model.nowhere.lora_B.weight": torch.zeros(64, 4),
            },
            "not a 2-D weight",
        ),
        (
            lambda a: {
                **a,
                "model.norm.lora_A.weight": torch.zeros(4, 64),
                "model.norm.lora_B.weight": torch.zeros(64, 4),
            },
            "not a 2-D weight",
        ),
        (
            lambda a: {
                **a,
                "lm_head.lora_A.weight": torch.zeros(4, 64),
                "lm_head.lora_B.weight": torch.zeros(1, 4),
            },
            "tied",
        ),
        (
            lambda a: {k: (v[:, :-1] if k.endswith("q_proj.lora_A.weight") else v) for k, v in a.items()},
            r"\(r, in\)",
        ),
        (
            lambda a: {
                k: (
                    v[:0]
                    if "q_proj.lora_" in k and "lora_A" in k
                    else v[:, :0]
                    if "q_proj.lora_B" in k
                    else v
                )
                for k, v in a.items()
            },
            "1 <= r",
        ),
        (
            lambda a: {k: (v.double() if k.endswith("v_proj.lora_B.weight") else v) for k, v in a.items()},
            "float64",
        ),
    ],
    ids=["not-lora", "unpaired", "unknown-module", "not-2d", "tied-head", "wrong-in", "rank-0", "dtype"],
)
def test_an_adapter_that_does_not_fit_is_refused_naming_what_is_wrong(edit, error) -> None:  # type: ignore[no-untyped-def]
    adapter, scale = broadcast_adapter(lora_model(targets=["q_proj", "v_proj"]))
    worker = build_tiny_policy(1).model
    before = {k: v.clone() for k, v in worker.state_dict().items()}
    base = BaseWeights(worker)
    with pytest.raises(BroadcastError, match=error):
        adapter_layout(worker.state_dict(), layout_of(edit(adapter)))
    with pytest.raises(BroadcastError, match=error):
        base.install_adapter(edit(adapter), base.hash, scale)
    assert same(worker.state_dict(), before)


def test_a_rank_above_the_weights_smaller_side_is_refused() -> None:
    worker = build_tiny_policy(1).model
    weight = worker.state_dict()["model.layers.0.self_attn.k_proj.weight"]
    out, inp = weight.shape
    rank = min(out, inp) + 1
    tensors = {
        "model.layers.0.self_attn.k_proj.lora_A.weight": ((rank, inp), torch.float32),
        "model.layers.0.self_attn.k_proj.lora_B.weight": ((out, rank), torch.float32),
    }
    with pytest.raises(BroadcastError, match="1 <= r"):
        adapter_layout(worker.state_dict(), tensors)


def test_adapter_fields_round_trip_and_are_checked_at_decode() -> None:
    blob, tensors = state_dict_to_blob(broadcast_adapter(lora_model())[0])
    manifest, _ = build_manifest(
        identity("l"), "tiny", 3, blob, tensors, 1 << 12, base_hash=b"\x01" * 32, adapter_scale=2.0
    )
    body = decode_manifest_body(encode_manifest_body(manifest.body))
    assert isinstance(body, WeightManifestBody)
    assert body.is_adapter and body.base_hash == b"\x01" * 32 and body.adapter_scale == 2.0
    whole, _ = build_manifest(identity("l"), "tiny", 3, blob, tensors, 1 << 12)
    decoded = decode_manifest_body(encode_manifest_body(whole.body))
    assert isinstance(decoded, WeightManifestBody) and not decoded.is_adapter
    for base_hash, scale, error in [
        (b"", 2.0, "adapter_scale without base_hash"),
        (b"\x01" * 31, 2.0, "base_hash is 31 bytes"),
        (b"\x01" * 32, 0.0, "must be > 0"),
        (b"\x01" * 32, -1.0, "adapter_scale"),
        (b"\x01" * 32, float("inf"), "adapter_scale"),
        (b"\x01" * 32, float("nan"), "adapter_scale"),
        (b"\x01" * 32, 1e9, "adapter_scale"),
    ]:
        proto = pb.WeightManifestBody()
        proto.ParseFromString(encode_manifest_body(manifest.body))
        proto.base_hash, proto.adapter_scale = base_hash, scale
        result = decode_manifest_body(proto.SerializeToString())
        assert isinstance(result, WireError) and error in result.detail, (base_hash, scale, result)
        with pytest.raises(ValueError, match="invalid manifest body"):
            encode_manifest_body(replace(manifest.body, base_hash=base_hash, adapter_scale=scale))


def learner_base(learner: torch.nn.Module) -> BaseWeights:
    """What a learner publishes adapters against: its spot-check copy over its live model's base."""
    return BaseWeights(plain_copy(learner), base_state_dict(learner))


def test_a_learner_sends_its_adapter_to_a_worker_of_its_base_and_whole_weights_to_another(
    tmp_path: Path,
) -> None:
    """Real data planes on 127.0.0.1: the worker of the learner's base installs each adapter version;
    a worker of another base refuses the first adapter manifest and is sent each version whole from
    then on. Both end with the learner's merged weights exactly."""

    async def body() -> None:
        learner_id = identity("learner")
        learner = lora_model()
        learner_dp = DataPlane(learner_id)
        await learner_dp.start()
        metrics = Metrics()
        archive = tmp_path / "published"
        publisher = WeightPublisher(
            learner_id, learner_dp, "tiny", 1 << 12, keep=2, metrics=metrics,
            archive=archive, base=learner_base(learner),
        )  # fmt: skip
        await publisher.start()
        workers = []
        try:
            for name, seed in [("same", 1), ("other", 2)]:
                wid = identity(name)
                dp = DataPlane(wid)
                await dp.start()
                policy = build_tiny_policy(seed)
                policy.version = -1
                receiver = WeightReceiver(
                    wid, dp, policy, make_engine("torch", policy), Metrics(),
                    learner_id=learner_id.peer_id, staleness_bound=2,
                )  # fmt: skip
                await receiver.start()
                receiver.set_peers({learner_id.peer_id: learner_dp.address})
                publisher.set_peers({wid.peer_id: dp.address})
                workers.append(
                    (PeerRecord(peer_id=wid.peer_id, addresses=(dp.address,)), dp, receiver, policy)
                )
            whole_bytes = sum(t.numel() * t.element_size() for t in merged_state_dict(learner).values())
            for version in range(4):
                if version:
                    train_adapters(learner, 10 + version)
                published = publisher.publish(version, learner)
                assert published.manifest.body.is_adapter
                assert published.manifest.body.total_bytes < 0.3 * whole_bytes
                for record, _, _, _ in workers:
                    publisher.tell(record)
                for _, _, _, policy in workers:
                    await until(lambda p=policy, v=version: p.version == v, f"v{version} at both workers")
                    assert same(policy.model.state_dict(), merged_state_dict(learner))
            assert metrics.value("workers_without_base") == 1
            assert metrics.value("manifest_failures") == 0
            other = workers[1][0].peer_id
            assert publisher.without_base == {other}
            assert not publisher.whole.keys() - publisher.published.keys()  # retired together
            names = sorted(p.name for p in archive.iterdir())
            assert names == ["2.blob", "2.whole.blob", "3.blob", "3.whole.blob"], names
            # The learner's spot-check copy loads an archived adapter version from its file.
            served = publisher.weights_of(3)
            assert served is not None and served[1].is_adapter
            scratch = BaseWeights(build_tiny_policy(1).model, base_state_dict(learner))
            scratch.install(*served)
            assert same(scratch.model.state_dict(), merged_state_dict(learner))
            assert same(blob_to_state_dict(served[0], served[1].tensors), broadcast_adapter(learner)[0])
            publisher.forget(other)  # restarted: it may hold our base now, and is asked again
            assert not publisher.without_base
        finally:
            for _, dp, receiver, _ in workers:
                await receiver.close()
                await dp.close()
            await publisher.close()
            await learner_dp.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_base_mismatch_refusal_names_both_bases() -> None:
    """What the learner's log shows for a worker of another base (the Refusal's detail)."""

    async def body() -> None:
        learner_id, wid = identity("learner"), identity("other")
        learner_dp, dp = DataPlane(learner_id), DataPlane(wid)
        await learner_dp.start()
        await dp.start()
        learner = lora_model()
        publisher = WeightPublisher(
            learner_id, learner_dp, "tiny", 1 << 12, keep=2, metrics=Metrics(),
            base=learner_base(learner),
        )  # fmt: skip
        policy = build_tiny_policy(2)
        receiver = WeightReceiver(
            wid, dp, policy, make_engine("torch", policy), Metrics(),
            learner_id=learner_id.peer_id, staleness_bound=2,
        )  # fmt: skip
        await publisher.start()
        await receiver.start()
        try:
            published = publisher.publish(0, learner)
            with pytest.raises(PeerRefused, match=r"base_mismatch.*start it with the learner's model"):
                await learner_dp.request(dp.address, None, envelope=published.manifest_envelope, timeout=5.0)
        finally:
            await receiver.close()
            await publisher.close()
            await dp.close()
            await learner_dp.close()

    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_model_given_whole_versions_only_never_hashes_its_base_and_refuses_adapters() -> None:
    """A learner that trains no adapters: its spot-check copy loads whole versions without spending
    a hash of the whole model (seconds at 0.5 B), and takes no adapter."""
    scratch = BaseWeights(build_tiny_policy(1).model, adapters=False)
    blob, tensors = state_dict_to_blob(build_tiny_policy(5).model.state_dict())
    scratch.install_whole(blob, tensors)
    assert "hash" not in vars(scratch)  # the cached property was never computed
    assert same(scratch.model.state_dict(), build_tiny_policy(5).model.state_dict())
    adapter, scale = broadcast_adapter(lora_model())
    with pytest.raises(BroadcastError, match="whole versions only"):
        scratch.install_adapter(adapter, bytes(32), scale)
