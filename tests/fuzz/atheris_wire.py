"""Coverage-guided fuzzing of every wire decoder and the admission pipeline (atheris / libFuzzer).

Not collected by pytest (the default suite runs the bounded hypothesis properties in
this folder); run it open-ended when touching ``swarmnode/wire`` or ``swarmnode/admit``:

    pip install -e '.[fuzz]'                      # atheris >= 2.3 (a manylinux wheel, no compiler needed)
    mkdir -p /tmp/swarmnode-corpus
    python tests/fuzz/atheris_wire.py -max_total_time=600 /tmp/swarmnode-corpus protocol/vectors

libFuzzer writes new inputs into the first directory; ``protocol/vectors`` only seeds it.
Any exception escaping a decoder or ``admit`` is a crash: libFuzzer stops and saves the
input as ``crash-<sha1>`` in the working directory. Reproduce with
``python tests/fuzz/atheris_wire.py crash-<sha1>`` (or ``swarmnode protocol check crash-<sha1>``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import atheris

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from a checkout without installing it

with atheris.instrument_imports(include=["swarmnode"]):
    from swarmnode.admit import Accepted, Rejected
    from swarmnode.tasks import TaskId, regenerate
    from swarmnode.wire.cli_protocol import pipeline_for_context
    from swarmnode.wire.envelope import Envelope, decode_envelope
    from swarmnode.wire.kinds import Kind
    from swarmnode.wire.messages import decode_manifest_body, decode_payload
    from swarmnode.wire.reasons import WireError

CONTEXT = json.loads((REPO / "protocol" / "vectors" / "manifest.json").read_text())["context"]
NOW = float(CONTEXT["now"])


def test_one_input(data: bytes) -> None:
    envelope = decode_envelope(data)
    if isinstance(envelope, Envelope):
        for kind in Kind:  # the payload under its own kind and under every other one
            decode_payload(kind, envelope.payload)
    else:
        assert isinstance(envelope, WireError)
    for kind in Kind:  # the raw bytes as a payload of each kind
        decode_payload(kind, data)
    decode_manifest_body(data)
    # A fresh receiver per input, so rate limits and the replay cache never mask deeper steps.
    verdict = pipeline_for_context(CONTEXT).admit(data, NOW, via="fuzzer")
    assert isinstance(verdict, Accepted | Rejected)


def main() -> None:
    dataset, config, prompt_format = CONTEXT["allowed_tasks"][0]
    regenerate(TaskId(dataset, config, 7, 0, prompt_format))  # import reasoning-gym before fuzzing
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
