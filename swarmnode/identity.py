"""Node identity: the Ed25519 key, the peer id derived from it, signing and verifying.

Owns: the key file (create, load, permission check), peer id derivation,
``verify_signature`` (the one place a signature is checked) and the optional
allowlist of keys for private swarms. Must not: know about envelopes or
message kinds (``swarmnode.wire.envelope`` builds the bytes that get signed).

Peer id (protocol/SPEC.md "Peer ids")::

    peer_id = base32_lower_nopad(SHA-256(public_key)[:20])

where ``public_key`` is the raw 32-byte Ed25519 public key and base32 is RFC
4648's alphabet in lower case without ``=`` padding: 32 characters from
``a-z2-7``. 160 bits keep accidental and brute-forced collisions out of reach
while staying short enough for logs; the key itself, not the id, is what
signatures are checked against.

Key file: PKCS#8 PEM, unencrypted, mode 0600. ``load_identity`` refuses a key
that group or others can read, with ``IdentityError`` naming the fix.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from swarmnode.errors import IdentityError

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
PEER_ID_DIGEST_BYTES = 20
MAX_KEY_FILE_BYTES = 16 * 1024


def peer_id_from_key(public_key: bytes) -> str:
    """The peer id of a raw 32-byte Ed25519 public key (see module docstring)."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, not {len(public_key)}")
    digest = hashlib.sha256(public_key).digest()[:PEER_ID_DIGEST_BYTES]
    return base64.b32encode(digest).decode("ascii").lower().rstrip("=")


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``.

    Never raises: wrong lengths and keys that are not curve points are just invalid.
    """
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class NodeIdentity:
    """A private key and what follows from it."""

    private_key: Ed25519PrivateKey = field(repr=False)
    public_key: bytes
    peer_id: str

    @classmethod
    def from_private_key(cls, key: Ed25519PrivateKey) -> NodeIdentity:
        public = key.public_key().public_bytes_raw()
        return cls(private_key=key, public_key=public, peer_id=peer_id_from_key(public))

    @classmethod
    def generate(cls) -> NodeIdentity:
        return cls.from_private_key(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> NodeIdentity:
        """Deterministic identity from a 32-byte seed (test vectors and simulations only)."""
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, not {len(seed)}")
        return cls.from_private_key(Ed25519PrivateKey.from_private_bytes(seed))

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )


def load_identity(path: Path) -> NodeIdentity:
    """Read the node key at ``path``; ``IdentityError`` if missing, unreadable, insecure or not Ed25519."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise IdentityError(f"node key {path} does not exist; create one with `swarmnode init`") from exc
    except OSError as exc:
        raise IdentityError(f"cannot open node key {path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)  # fstat on the open file: no window between check and read
        if not stat.S_ISREG(info.st_mode):
            raise IdentityError(f"node key {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise IdentityError(
                f"node key {path} is readable or writable by group or others (mode {mode:04o}); "
                f"run `chmod 600 {path}`"
            )
        if info.st_size > MAX_KEY_FILE_BYTES:
            raise IdentityError(f"node key {path} is {info.st_size} bytes; a key file is well under 1 KiB")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise IdentityError(f"cannot read node key {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise IdentityError(f"node key {path} is not an unencrypted PKCS#8 PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"node key {path} holds a {type(key).__name__}; swarmnode needs an Ed25519 key")
    return NodeIdentity.from_private_key(key)


def create_identity(path: Path) -> NodeIdentity:
    """Generate a key and write it to ``path`` (mode 0600, atomically); never overwrites."""
    identity = NodeIdentity.generate()
    data = _pem(identity.private_key)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # O_EXCL + mode 0600 at creation: the key is never readable by others, not even briefly.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and fails instead of replacing an existing key
        except FileExistsError as exc:
            raise IdentityError(f"node key {path} already exists; refusing to overwrite it") from exc
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise IdentityError(f"cannot write node key {path}: {exc.strerror}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return identity


def load_or_create_identity(path: Path) -> NodeIdentity:
    """Load the key at ``path``, creating it first if there is none."""
    if not path.exists():
        try:
            return create_identity(path)
        except IdentityError:
            if not path.exists():  # a real failure, not a concurrent creator winning the race
                raise
    return load_identity(path)


@dataclass(frozen=True)
class KeyAllowlist:
    """Public keys admitted to a private swarm; everyone else's messages are refused."""

    keys: frozenset[bytes]

    @classmethod
    def from_keys(cls, keys: Iterable[bytes]) -> KeyAllowlist:
        keys = frozenset(keys)
        for key in keys:
            if len(key) != PUBLIC_KEY_BYTES:
                raise IdentityError(f"allowlist key {key.hex()} is {len(key)} bytes, not {PUBLIC_KEY_BYTES}")
        return cls(keys)

    @classmethod
    def from_file(cls, path: Path) -> KeyAllowlist:
        """One hex-encoded 32-byte public key per line; blank lines and ``#`` comments ignored."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise IdentityError(f"cannot read key allowlist {path}: {exc}") from exc
        keys = []
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                key = bytes.fromhex(line)
            except ValueError as exc:
                raise IdentityError(f"{path}:{number}: not a hex public key: {line[:80]!r}") from exc
            if len(key) != PUBLIC_KEY_BYTES:
                raise IdentityError(f"{path}:{number}: a public key is 64 hex digits, got {len(line)}")
            keys.append(key)
        return cls(frozenset(keys))

    def allows(self, public_key: bytes) -> bool:
        return public_key in self.keys

    def peer_ids(self) -> frozenset[str]:
        return frozenset(peer_id_from_key(k) for k in self.keys)
