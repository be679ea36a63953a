"""Red team: adapter versions (SPEC 1.5). Each test names the finding it pins down."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

import swarmnode.broadcast.adapter as adapter_module
import swarmnode.broadcast.weights as weights_module
from swarmnode.broadcast.adapter import BaseWeights
from swarmnode.broadcast.weights import WeightPublisher
from swarmnode.config import Config
from swarmnode.net.dataplane import DataPlane, RefuseRequest
from swarmnode.ops.metrics import Metrics
from swarmnode.policy import build_tiny_policy
from swarmnode.policy.lora import broadcast_adapter, merged_state_dict
from swarmnode.wire import Kind, PeerRecord
from tests.workers.test_adapter_broadcast import learner_base, lora_model, same
from tests.workers.test_weights import identity, until


@contextlib.asynccontextmanager
async def publisher_and_refusing_worker(
    learner: torch.nn.Module, archive: Path
) -> AsyncIterator[tuple[WeightPublisher, PeerRecord]]:
    """A LoRA learner's publisher (archive on disk) and a worker that answers every manifest
    ``base_mismatch``, on real data planes; the publisher is closed on the way out (again is fine)."""
    lid, wid = identity("learner"), identity("mallory")
    ldp, wdp = DataPlane(lid), DataPlane(wid)
    await ldp.start()
    await wdp.start()

    async def refuse(sender, envelope, message):  # type: ignore[no-untyped-def]
        raise RefuseRequest("base_mismatch", "another base")

    wdp.register(Kind.WEIGHT_MANIFEST, refuse)
    publisher = WeightPublisher(
        lid, ldp, "tiny", 1 << 12, keep=2, metrics=Metrics(), archive=archive, base=learner_base(learner)
    )
    await publisher.start()
    try:
        yield publisher, PeerRecord(peer_id=wid.peer_id, addresses=(wdp.address,))
    finally:
        await publisher.close()
        await wdp.close()
        await ldp.close()


def test_a_base_mismatch_never_makes_the_learner_build_whole_versions_on_its_event_loop(
    tmp_path: Path,
) -> None:
    """F1: one worker answering ``base_mismatch`` (to every manifest, whole ones too) made every later
    ``publish()`` merge, hash and write the whole model synchronously on the learner's event loop
    (seconds at 0.5 B: data plane, heartbeats and honest workers' chunk requests all wait)."""

    async def body() -> None:
        learner = lora_model()
        async with publisher_and_refusing_worker(learner, tmp_path) as (publisher, mallory):
            on_loop: list[str] = []
            archived = publisher._archived

            def watched(name, state):  # type: ignore[no-untyped-def]
                if "whole" in name and threading.current_thread() is threading.main_thread():
                    on_loop.append(name)
                return archived(name, state)

            publisher._archived = watched  # type: ignore[method-assign]
            publisher.publish(0, learner)
            publisher.tell(mallory)
            await until(lambda: 0 in publisher.whole, "v0 whole, built lazily")
            for version in (1, 2):
                publisher.publish(version, learner)
                publisher.tell(mallory)
                await until(lambda v=version: v in publisher.whole, f"v{version} whole")
            assert on_loop == [], f"whole versions written on the event loop: {on_loop}"

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_failed_adapter_install_leaves_no_delta_a_later_version_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """F2: an exception part-way through ``install_adapter`` (an allocation failing for one weight)
    left the weights merged before it holding the new delta, and ``_adapted`` not naming them: a
    later version that does not adapt them never reset them, and the worker reported that version
    installed with weights that are not the learner's."""
    worker = build_tiny_policy(1).model
    base = BaseWeights(worker)
    v1 = lora_model(targets=["q_proj"], trained=1)
    base.install_adapter(*broadcast_adapter(v1)[:1], base.hash, broadcast_adapter(v1)[1])
    v2 = lora_model(targets=["q_proj", "v_proj"], trained=2)
    calls = {"n": 0}
    real = adapter_module.merge_delta

    def flaky(*args):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:  # layers.0 q and v merged, then layers.1 q_proj fails
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return real(*args)

    monkeypatch.setattr(adapter_module, "merge_delta", flaky)
    adapter, scale = broadcast_adapter(v2)
    with pytest.raises(RuntimeError):
        base.install_adapter(adapter, base.hash, scale)
    monkeypatch.setattr(adapter_module, "merge_delta", real)
    v3 = lora_model(targets=["q_proj"], trained=3)
    adapter, scale = broadcast_adapter(v3)
    base.install_adapter(adapter, base.hash, scale)  # succeeds: the worker reports v3 installed
    theirs, ours = merged_state_dict(v3), worker.state_dict()
    wrong = [k for k in theirs if not torch.equal(theirs[k], ours[k])]
    assert same(ours, theirs), f"after v3 installed, differs from the learner's v3 at {wrong}"


@pytest.mark.parametrize("alpha", [1e6, float("inf")])
def test_the_config_refuses_a_lora_scale_no_adapter_manifest_can_carry(alpha: float) -> None:
    """F4: ``learn.lora_alpha`` / ``lora_rank`` outside (0, 65536] (SPEC 1.5 ``adapter_scale``) was
    accepted, and the learner then died publishing version 0 (``refusing to encode an invalid
    manifest body``)."""
    with pytest.raises(ValueError, match="lora_alpha"):
        Config.model_validate({"learn": {"lora_rank": 2, "lora_alpha": alpha}})


def test_a_whole_version_being_written_when_the_publisher_closes_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F3: a whole version built lazily (in a thread) when the publisher closed was still moved into
    the archive after ``close()`` returned and the archive lock was released."""
    writing, release = threading.Event(), threading.Event()
    real = weights_module.write_blob

    def slow(state, file, chunk_size):  # type: ignore[no-untyped-def]
        if "whole" in Path(file.name).name:
            writing.set()
            release.wait(30)
        return real(state, file, chunk_size)

    monkeypatch.setattr(weights_module, "write_blob", slow)

    async def body() -> None:
        learner = lora_model()
        archive = tmp_path / "published"
        async with publisher_and_refusing_worker(learner, archive) as (publisher, mallory):
            try:
                publisher.publish(0, learner)
                publisher.tell(mallory)
                await until(writing.is_set, "the whole version being written")
                closing = asyncio.get_running_loop().create_task(publisher.close())
                await asyncio.sleep(0.2)
                release.set()
                await closing
                await asyncio.sleep(1.0)  # the writing thread has finished by now
                assert sorted(p.name for p in archive.iterdir()) == ["0.blob"]
            finally:
                release.set()

    asyncio.run(asyncio.wait_for(body(), 60))
