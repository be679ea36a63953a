"""Inputs the atheris fuzzer (tests/fuzz/atheris_wire.py) found crashing a decoder, replayed.

Each test names the decoder and the failure it had; the input is the minimal form of the one
libFuzzer saved. They run without atheris.
"""

from __future__ import annotations

from hivemind.dht.validation import DHTRecord

from swarmnode.net.libp2p_identity import peer_id_from_owner_key
from swarmnode.net.records import (
    OwnedRecordsOnlyValidator,
    OwnerSignatureValidator,
    make_record_validators,
    owner_marker,
    records_from_dictionary,
)

# An OpenSSH-framed public key of a type cryptography does not know: a length-prefixed
# key-type string of arbitrary bytes. load_ssh_public_key raises UnsupportedAlgorithm for it,
# which is not a ValueError.
UNKNOWN_KEY_TYPE = b":\x8bE`}v}i\x8b#\x1b\xe4\xb1U"
SSH_KEY_OF_UNKNOWN_TYPE = UNKNOWN_KEY_TYPE + b" AAAADnNzaC1ub3QtYS10eXBl"


def test_an_owner_marker_with_a_key_of_unknown_type_names_no_owner() -> None:
    assert peer_id_from_owner_key(SSH_KEY_OF_UNKNOWN_TYPE) is None
    assert peer_id_from_owner_key(UNKNOWN_KEY_TYPE) is None


def test_records_whose_owner_key_is_of_unknown_type_are_skipped_not_raised() -> None:
    honest = OwnerSignatureValidator()
    entries = {
        b"[owner:" + SSH_KEY_OF_UNKNOWN_TYPE + b"]part0": (b"value", 1.0),
        b"[owner:" + UNKNOWN_KEY_TYPE + b"]part1": (b"value", 1.0),
        owner_marker(honest.local_public_key[len(b"[owner:") : -1]) + b"part2": (b"value", 2.0),
    }
    records = records_from_dictionary(entries)
    assert [r.subkey for r in records] == [b"part2"]


def test_the_signature_validator_refuses_a_record_whose_owner_key_cannot_be_parsed() -> None:
    # hivemind's RSASignatureValidator raised UnsupportedAlgorithm / ValueError out of validate()
    # (on a peer's store request, or on a get answer) for such a subkey.
    validator = OwnerSignatureValidator()
    for key in (SSH_KEY_OF_UNKNOWN_TYPE, UNKNOWN_KEY_TYPE, b"ssh-rsa AAAA", b"\x00"):
        record = DHTRecord(b"key", b"[owner:" + key + b"]part0", b"value[signature:xx]", 1.0)
        assert validator.validate(record) is False


def test_the_runtime_validators_are_the_ones_that_refuse_instead_of_raising() -> None:
    signing = OwnerSignatureValidator()
    validators = make_record_validators(signing, 4096)
    assert validators[0] is signing and isinstance(validators[1], OwnedRecordsOnlyValidator)
    # A record signed by this validator still validates (the subclass changes nothing else).
    record = DHTRecord(b"key", signing.local_public_key + b"part0", b"value", 1.0)
    signed = DHTRecord(record.key, record.subkey, signing.sign_value(record), 1.0)
    assert signing.validate(signed) is True
