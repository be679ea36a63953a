"""The node's libp2p identity: an RSA-2048 key file that p2pd reads with ``-id``.

Owns: creating the key file atomically (temp file, fsync, rename, 0600),
loading and checking it, the libp2p peer id of a key, and the same key in the
form hivemind's ``RSASignatureValidator`` signs DHT records with.
Must not: know about the node's Ed25519 key; binding the two is the signed
PeerRecord of ``swarmnode.wire``.

Why RSA and why one key for both jobs: hivemind 1.1.12 derives peer ids and
checks "identity already taken" only for RSA keys (``PeerID.from_identity``),
and its record validator signs with RSA. Using the libp2p key to sign DHT
records makes every record's owner a libp2p peer id that anyone can compute
from the record itself (``peer_id_from_owner_key``), and libp2p authenticates
that same peer id on every stream, so "who announced this" and "whom do I pull
it from" are the same checked name. The signed bytes cannot collide with
libp2p's own signatures: those start with an ASCII domain string
("libp2p-tls-handshake:", "noise-libp2p-static-key:"), ours with a msgpack
array header (0x94).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import base58
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.protobuf.message import DecodeError
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey

from swarmnode.errors import IdentityError

RSA_KEY_BITS = 2048
_SHA2_256_MULTIHASH_PREFIX = bytes([0x12, 0x20])  # multihash code sha2-256, digest length 32


class _LoadedRSAPrivateKey(RSAPrivateKey):
    """hivemind's RSAPrivateKey built from an existing key instead of a fresh one."""

    def __init__(
        self, key: rsa.RSAPrivateKey
    ) -> None:  # deliberately no super().__init__: it generates a key
        self._private_key = key


@dataclass(frozen=True)
class Libp2pIdentity:
    """An RSA libp2p identity loaded from (or created at) ``path``."""

    path: Path
    peer_id: str  # base58 libp2p peer id ("Qm...")
    created: bool  # the file was created by this load (a brand-new peer id)
    _key: rsa.RSAPrivateKey = field(repr=False)

    def record_signing_key(self) -> RSAPrivateKey:
        """The same key as hivemind's RSAPrivateKey, for ``RSASignatureValidator``."""
        return _LoadedRSAPrivateKey(self._key)

    def public_key_ssh(self) -> bytes:
        """The public key as hivemind puts it in record owner markers (OpenSSH format)."""
        return self._key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )


def peer_id_of_public_key(public_key: rsa.RSAPublicKey) -> str:
    """libp2p peer id of an RSA public key (libp2p peer-ids spec: sha2-256 multihash of the
    protobuf-encoded PublicKey, base58btc)."""
    spki = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=spki).SerializeToString()
    digest = hashlib.sha256(encoded).digest()
    return base58.b58encode(_SHA2_256_MULTIHASH_PREFIX + digest).decode()


def peer_id_from_owner_key(owner_key_ssh: bytes) -> str | None:
    """Peer id of the OpenSSH RSA public key found in a record's owner marker; None if not one."""
    try:
        key = serialization.load_ssh_public_key(owner_key_ssh)
    # UnsupportedAlgorithm: a well-formed key of an unknown type (found by fuzzing; it is not
    # a ValueError, and the marker is any bytes a peer put in a DHT subkey).
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None
    if not isinstance(key, rsa.RSAPublicKey):
        return None
    return peer_id_of_public_key(key)


def load_or_create_identity(path: Path) -> Libp2pIdentity:
    """Load the identity at ``path``; create it first (atomically, mode 0600) if it does not exist.

    Raises IdentityError naming the file when it exists but is unreadable, not an
    RSA libp2p key, or readable by group/others.
    """
    created = not path.exists() and _write_new_identity(path)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as e:
        raise IdentityError(f"cannot read libp2p identity {path}: {e}") from e
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(
            f"libp2p identity {path} is readable by other users (mode {oct(mode & 0o777)}); "
            f"fix with: chmod 600 {path}"
        )
    key = _parse_identity(path, data)
    return Libp2pIdentity(
        path=path, peer_id=peer_id_of_public_key(key.public_key()), created=created, _key=key
    )


def _parse_identity(path: Path, data: bytes) -> rsa.RSAPrivateKey:
    fix = "move it away to let the node create a new identity (a new peer id), or restore it from a backup"
    try:
        message = crypto_pb2.PrivateKey.FromString(data)
    except DecodeError as e:
        raise IdentityError(f"libp2p identity {path} is not a libp2p private key ({e}); {fix}") from e
    if message.key_type != crypto_pb2.RSA:
        raise IdentityError(f"libp2p identity {path} is not an RSA key (type {message.key_type}); {fix}")
    try:
        key = serialization.load_der_private_key(message.data, password=None)
    except (ValueError, TypeError) as e:
        raise IdentityError(f"libp2p identity {path} holds a corrupt RSA key ({e}); {fix}") from e
    if not isinstance(key, rsa.RSAPrivateKey):
        raise IdentityError(f"libp2p identity {path} is not an RSA key; {fix}")
    return key


def _write_new_identity(path: Path) -> bool:
    """Write a new key to ``path`` unless a file appeared there meanwhile; return whether written."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    # Same encoding as hivemind's P2P.generate_identity, so p2pd and PeerID.from_identity read it.
    der = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    data = crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp_name = tempfile.mkstemp(prefix=".libp2p-key-", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # link() fails if another process created the file meanwhile: never overwrite an identity.
        try:
            os.link(tmp_name, path)
        except FileExistsError:
            return False
    finally:
        os.unlink(tmp_name)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True
