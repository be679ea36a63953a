"""Node identity: key file rules, peer id derivation, signatures that never raise, allowlists."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from swarmnode.errors import IdentityError
from swarmnode.identity import (
    KeyAllowlist,
    NodeIdentity,
    create_identity,
    load_identity,
    load_or_create_identity,
    peer_id_from_key,
    verify_signature,
)


def test_peer_id_is_lower_base32_of_the_first_20_bytes_of_sha256_of_the_key() -> None:
    key = bytes(range(32))
    expected = base64.b32encode(hashlib.sha256(key).digest()[:20]).decode().lower().rstrip("=")
    assert peer_id_from_key(key) == expected
    assert len(expected) == 32 and set(expected) <= set("abcdefghijklmnopqrstuvwxyz234567")


def test_peer_id_of_a_known_seed_is_stable() -> None:
    # Pinned so a change of the derivation cannot go unnoticed (it would orphan every ban and record).
    identity = NodeIdentity.from_seed(hashlib.sha256(b"swarmnode test vector key sender").digest())
    assert identity.peer_id == "6pasmonaqisra63yc36zktgumr74tspj"


def test_peer_id_refuses_a_key_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        peer_id_from_key(bytes(31))


def test_created_key_file_is_mode_0600_and_loads_back_to_the_same_identity(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "node.key"
    created = create_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = load_identity(path)
    assert loaded.public_key == created.public_key
    assert loaded.peer_id == created.peer_id
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert not list(path.parent.glob(".*tmp")), "no temp file left behind"


def test_created_key_file_is_0600_even_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = tmp_path / "node.key"
        create_identity(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o666])
def test_a_key_file_others_can_read_is_refused_with_the_fix_in_the_message(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.key"
    create_identity(path)
    path.chmod(mode)
    with pytest.raises(IdentityError, match=r"chmod 600") as info:
        load_identity(path)
    assert str(path) in str(info.value)
    assert f"{mode:04o}" in str(info.value)


def test_missing_key_file_is_an_identity_error_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="does not exist"):
        load_identity(tmp_path / "absent.key")


def test_a_key_file_that_is_not_pem_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    path.write_bytes(b"not a key")
    path.chmod(0o600)
    with pytest.raises(IdentityError, match="PKCS#8 PEM"):
        load_identity(path)


def test_a_non_ed25519_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    with pytest.raises(IdentityError, match="Ed25519"):
        load_identity(path)


def test_a_directory_is_not_a_key_file(tmp_path: Path) -> None:
    (tmp_path / "node.key").mkdir(mode=0o700)
    with pytest.raises(IdentityError):
        load_identity(tmp_path / "node.key")


def test_create_never_overwrites_an_existing_key(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    first = create_identity(path)
    with pytest.raises(IdentityError, match="already exists"):
        create_identity(path)
    assert load_identity(path).public_key == first.public_key


def test_load_or_create_creates_once_then_keeps_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "home" / "node.key"
    first = load_or_create_identity(path)
    second = load_or_create_identity(path)
    assert first.peer_id == second.peer_id


def test_signatures_verify_and_any_change_breaks_them() -> None:
    identity = NodeIdentity.generate()
    signature = identity.sign(b"message")
    assert verify_signature(identity.public_key, signature, b"message")
    assert not verify_signature(identity.public_key, signature, b"messagf")
    assert not verify_signature(NodeIdentity.generate().public_key, signature, b"message")


@pytest.mark.parametrize(
    ("key", "signature"),
    [(bytes(31), bytes(64)), (bytes(32), bytes(63)), (bytes(32), bytes(64)), (b"\xff" * 32, b"\xff" * 64)],
)
def test_verify_signature_never_raises_on_garbage(key: bytes, signature: bytes) -> None:
    assert verify_signature(key, signature, b"m") is False


def test_from_seed_is_deterministic_and_checks_the_seed_length() -> None:
    assert NodeIdentity.from_seed(bytes(32)).public_key == NodeIdentity.from_seed(bytes(32)).public_key
    with pytest.raises(ValueError):
        NodeIdentity.from_seed(bytes(16))


def test_allowlist_file_takes_hex_keys_with_comments_and_blank_lines(tmp_path: Path) -> None:
    a, b, c = (NodeIdentity.generate() for _ in range(3))
    path = tmp_path / "allow.txt"
    path.write_text(f"# private swarm\n{a.public_key.hex()}  # alice\n\n{b.public_key.hex().upper()}\n")
    allowlist = KeyAllowlist.from_file(path)
    assert allowlist.allows(a.public_key) and allowlist.allows(b.public_key)
    assert not allowlist.allows(c.public_key)
    assert allowlist.peer_ids() == {a.peer_id, b.peer_id}


@pytest.mark.parametrize("line", ["zz" * 32, "ab" * 31, "ab" * 33])
def test_allowlist_file_with_a_bad_line_is_refused_naming_the_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "allow.txt"
    path.write_text(f"# header\n{line}\n")
    with pytest.raises(IdentityError, match=r"allow\.txt:2"):
        KeyAllowlist.from_file(path)


def test_missing_allowlist_file_is_an_identity_error(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="cannot read key allowlist"):
        KeyAllowlist.from_file(tmp_path / "none.txt")
