"""Coverage-guided fuzzing of every decoder of untrusted bytes (atheris / libFuzzer).

Not collected by pytest (the default suite runs the bounded hypothesis properties in
this folder); run it when touching ``swarmnode/wire``, ``swarmnode/admit``,
``swarmnode/net`` or ``swarmnode/gossip/driver.py``:

    pip install -e '.[fuzz]'                      # atheris >= 2.3 (a manylinux wheel, no compiler needed)
    python tests/fuzz/atheris_wire.py --seeds /tmp/swarmnode-corpus   # vectors, once per target
    python tests/fuzz/atheris_wire.py -atheris_runs=1000000 /tmp/swarmnode-corpus
    python tests/fuzz/atheris_wire.py -max_total_time=600 /tmp/swarmnode-corpus

The first input byte picks the decoder (``TARGETS`` below, one libFuzzer run covers them
all); the rest is that decoder's input. At exit the number of inputs each target got is
printed (``fuzz-counts: {...}``) and, with ``SWARMNODE_FUZZ_COUNTS=PATH``, written there as JSON.
libFuzzer writes new inputs into the corpus directory; ``--seeds`` fills it with every
``protocol/vectors`` file behind each target's selector byte, plus framed copies for ``frames``.
Any exception escaping a decoder is a crash: libFuzzer stops and saves the input as
``crash-<sha1>`` in the working directory. Reproduce with
``python tests/fuzz/atheris_wire.py crash-<sha1>``.

Decoders of bytes a peer controls, one target each:

- ``envelope``: ``wire.decode_envelope``, then ``Envelope.verify`` (Ed25519 key and
  signature parsing) and ``decode_payload`` of its payload under every ``Kind``;
- ``payload``: the raw bytes as the payload of every ``Kind`` (every message the wire
  helper adds to ``Kind`` is included automatically), and ``verify_manifest`` on a
  decoded ``WeightManifest``;
- ``manifest_body``: ``wire.decode_manifest_body``;
- ``admit``: ``AdmissionPipeline.admit`` (decode, limits, signature, re-derive, re-score);
- ``pull_response``: ``exchange.decode_items`` and ``envelope_digest`` of each item;
- ``pull_request``: the pull handler's request (digests) into ``GossipCore``;
- ``announcement``: a DHT announcement value (``decode_payload(ANNOUNCE)``) into ``GossipCore``;
- ``frames``: ``net.framing.read_message`` (the stream reader, with a small limit);
- ``dht_records``: ``net.records.records_from_dictionary`` (owner-marker parsing, the
  owner's OpenSSH RSA key) and both record validators (signature and ownership) on
  records with fuzzed subkeys and values;
- ``peer_record``: ``workers.records.read_record`` (a worker's or learner's signed
  ``PeerRecord`` read from the DHT);
- ``dataplane``: one request through ``net.dataplane.DataPlane._answer`` (decode, verify,
  payload, dispatch to a handler of every kind, answer); its frames are ``frames``' reader.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import atheris

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from a checkout without installing it

with atheris.instrument_imports(include=["swarmnode"]):
    from hivemind.dht.validation import DHTRecord

    from swarmnode.activation.records import read_record
    from swarmnode.admit import Accepted, Rejected
    from swarmnode.gossip.core import Announced, GossipConfig, GossipCore, PullRequest
    from swarmnode.gossip.driver import DIGEST_BYTES, decode_items
    from swarmnode.gossip.intake import envelope_digest
    from swarmnode.identity import NodeIdentity
    from swarmnode.net.dataplane import DataPlane
    from swarmnode.net.framing import FramingError, MessageTooLarge, RemoteRefused, read_message
    from swarmnode.net.records import (
        OwnedRecordsOnlyValidator,
        OwnerSignatureValidator,
        owner_marker,
        records_from_dictionary,
    )
    from swarmnode.tasks import TaskId, regenerate
    from swarmnode.tools.protocol_cli import pipeline_for_context
    from swarmnode.wire import Announce, PeerRecord, WeightManifest
    from swarmnode.wire.envelope import Envelope, decode_envelope, verify_manifest
    from swarmnode.wire.kinds import Kind
    from swarmnode.wire.messages import decode_manifest_body, decode_payload
    from swarmnode.wire.reasons import WireError

CONTEXT = json.loads((REPO / "protocol" / "vectors" / "manifest.json").read_text())["context"]
NOW = float(CONTEXT["now"])
FRAME_LIMIT = 4096
COUNTS: Counter[str] = Counter()
LOOP = asyncio.new_event_loop()
# A real owner key for the record target, so fuzzed records get past the marker parser.
_SIGNER = OwnerSignatureValidator()
OWNER = owner_marker(_SIGNER.local_public_key)


def fuzz_envelope(data: bytes) -> None:
    envelope = decode_envelope(data)
    if isinstance(envelope, Envelope):
        envelope.verify()
        envelope.envelope_id()
        for kind in Kind:  # the payload under its own kind and under every other one
            decode_payload(kind, envelope.payload)
    else:
        assert isinstance(envelope, WireError)


def fuzz_payload(data: bytes) -> None:
    for kind in Kind:
        message = decode_payload(kind, data)
        assert not isinstance(message, Exception)
        if isinstance(message, WeightManifest):
            verify_manifest(message)


def fuzz_manifest_body(data: bytes) -> None:
    decode_manifest_body(data)


def fuzz_admit(data: bytes) -> None:
    # A fresh receiver per input, so rate limits and the replay cache never mask deeper steps.
    verdict = pipeline_for_context(CONTEXT).admit(data, NOW, via="fuzzer")
    assert isinstance(verdict, Accepted | Rejected)


def _core() -> GossipCore:
    return GossipCore(GossipConfig(round_seconds=2.0), "self", digest_of=envelope_digest)


def fuzz_pull_response(data: bytes) -> None:
    try:
        items = decode_items(data, 64)
    except ValueError:
        return
    for item in items:
        envelope_digest(item)


def fuzz_pull_request(data: bytes) -> None:
    # What GossipDriver._serve_pull does with a request of whole digests.
    if len(data) % DIGEST_BYTES:
        return
    digests = tuple(data[i : i + DIGEST_BYTES] for i in range(0, len(data), DIGEST_BYTES))
    _core().handle(PullRequest("peer", digests), NOW)


def fuzz_announcement(data: bytes) -> None:
    # What GossipDriver._read does with one DHT record's value.
    message = decode_payload(Kind.ANNOUNCE, data)
    if isinstance(message, Announce):
        core = _core()
        core.handle(Announced("peer", message.round, tuple(message.rollout_digests)), NOW)
        core.poll(NOW + 1.0)


def fuzz_frames(data: bytes) -> None:
    reader = asyncio.StreamReader(loop=LOOP)
    reader.feed_data(data)
    reader.feed_eof()
    try:
        message = LOOP.run_until_complete(read_message(reader, FRAME_LIMIT))
    except (FramingError, MessageTooLarge, RemoteRefused):
        return
    assert len(message) <= FRAME_LIMIT


def fuzz_dht_records(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    entries: dict[object, tuple[object, float]] = {}
    validators = (_SIGNER, OwnedRecordsOnlyValidator(256))
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        owned = fdp.ConsumeBool()
        subkey = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
        if owned:
            subkey = OWNER + subkey
        elif fdp.ConsumeBool():
            subkey = b"[owner:" + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 600)) + b"]" + subkey
        value = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
        expiration = fdp.ConsumeFloat()
        entries[subkey] = (value, expiration)
        for validator in validators:
            record = DHTRecord(key=b"k", subkey=subkey, value=value, expiration_time=expiration)
            validator.validate(record)
    records_from_dictionary(entries)


def fuzz_peer_record(data: bytes) -> None:
    # A worker's / learner's signed PeerRecord read from the DHT (swarmnode.activation.records).
    assert isinstance(read_record(data), str | PeerRecord)


class _SinkWriter:
    """Stands in for the data plane's asyncio.StreamWriter: keeps what the server answers."""

    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: bytes) -> None:
        self.out += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


async def _no_answer(sender: str, envelope: object, message: object) -> None:
    return None


DATA_PLANE = DataPlane(NodeIdentity.generate())
for _kind in Kind:
    DATA_PLANE.register(_kind, _no_answer)


def fuzz_dataplane(data: bytes) -> None:
    # One request as the direct-TCP data plane's server handles it (net/dataplane.py): decode,
    # verify, decode the payload, dispatch, answer (or refuse with an ERROR frame).
    writer = _SinkWriter()
    assert LOOP.run_until_complete(DATA_PLANE._answer(data, writer))  # type: ignore[arg-type]


TARGETS: tuple[tuple[str, Callable[[bytes], None]], ...] = (
    ("envelope", fuzz_envelope),
    ("payload", fuzz_payload),
    ("manifest_body", fuzz_manifest_body),
    ("admit", fuzz_admit),
    ("pull_response", fuzz_pull_response),
    ("pull_request", fuzz_pull_request),
    ("announcement", fuzz_announcement),
    ("frames", fuzz_frames),
    ("dht_records", fuzz_dht_records),
    ("peer_record", fuzz_peer_record),
    ("dataplane", fuzz_dataplane),
)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    # Seeds from protocol/vectors are envelopes: their first byte (0x08, field 1) picks
    # "envelope"-like targets by the modulo; libFuzzer mutates it to reach the others.
    name, target = TARGETS[data[0] % len(TARGETS)]
    COUNTS[name] += 1
    target(data[1:])
    # Every target also sees the whole input as an envelope: keeps the vector seeds useful.
    if name != "envelope":
        decode_envelope(data)


def report() -> None:
    counts = dict(COUNTS, total=sum(COUNTS.values()))
    print("fuzz-counts: " + json.dumps(counts), flush=True)
    out = os.environ.get("SWARMNODE_FUZZ_COUNTS")
    if out:
        Path(out).write_text(json.dumps(counts, indent=1))


def write_seeds(directory: Path) -> int:
    """Every vector behind each target's selector byte (and framed, for the frame reader)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = 0
    for vector in sorted((REPO / "protocol" / "vectors").glob("*.bin")):
        data = vector.read_bytes()
        framed = b"\x00" + len(data).to_bytes(4, "big") + data + b"\x01\x00\x00\x00\x00"
        for index, (name, _) in enumerate(TARGETS):
            body = framed if name == "frames" else data
            (directory / f"seed-{name}-{vector.stem}").write_bytes(bytes([index]) + body)
            written += 1
    return written


def main() -> None:
    if sys.argv[1:2] == ["--seeds"]:
        print(f"{write_seeds(Path(sys.argv[2]))} seeds written to {sys.argv[2]}")
        return
    dataset, config, prompt_format = CONTEXT["allowed_tasks"][0]
    regenerate(TaskId(dataset, config, 7, 0, prompt_format))  # import reasoning-gym before fuzzing
    atexit.register(report)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
