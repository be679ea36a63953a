"""The committed protobuf code is exactly what protoc makes of the committed .proto."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from swarmnode.tools import generate_proto as generate
from swarmnode.wire import swarm_pb2 as pb
from swarmnode.wire.kinds import MANIFEST_BODY_PREFIX, Kind, Role, signing_prefix


def test_package_copy_of_the_proto_is_byte_identical_to_protocol_swarm_proto() -> None:
    assert generate.PACKAGE_PROTO.read_bytes() == generate.CANONICAL_PROTO.read_bytes()


def test_committed_generated_code_matches_a_fresh_protoc_run_byte_for_byte() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the code")
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate.generate_into(generate.PACKAGE_PROTO, Path(tmp))
    for name, content in fresh.items():
        committed = (generate.WIRE_DIR / name).read_bytes()
        assert committed == content, f"{name} is stale: run `python -m swarmnode.tools.generate_proto`"


def test_python_kind_and_role_enums_match_the_proto_numbers() -> None:
    proto_kinds = {
        v.name.removeprefix("KIND_"): v.number for v in pb.DESCRIPTOR.enum_types_by_name["Kind"].values
    }
    assert proto_kinds.pop("UNSPECIFIED") == 0
    assert proto_kinds == {k.name: k.value for k in Kind}
    proto_roles = {
        v.name.removeprefix("ROLE_"): v.number for v in pb.DESCRIPTOR.enum_types_by_name["Role"].values
    }
    assert proto_roles.pop("UNSPECIFIED") == 0
    assert proto_roles == {r.name: r.value for r in Role}


def test_every_signing_prefix_is_distinct_and_none_is_a_prefix_of_another() -> None:
    prefixes = [signing_prefix(k) for k in Kind] + [MANIFEST_BODY_PREFIX]
    assert len(set(prefixes)) == len(prefixes)
    for a in prefixes:
        assert a.startswith(b"swarmnode/v1/") and a.endswith(b"\x00")
        for b in prefixes:
            assert a == b or not b.startswith(a)


def test_descriptor_lives_under_a_name_no_other_package_registers() -> None:
    assert pb.DESCRIPTOR.name == "swarmnode/wire/swarm.proto"
    assert pb.DESCRIPTOR.package == "swarmnode.v1"
