"""The FL protocol as one typed object: user-facing names, server changes, the wire form."""

from __future__ import annotations

import pytest

from fedleak.harness.federated.protocol import (
    Protocol,
    ProtocolChanges,
    ProtocolError,
    changes_from_options,
)
from fedleak.harness.wire.protocol_spec import changes_from_pb, protocol_from_pb, protocol_to_pb
from fedleak.v1 import victim_pb2 as pb


def test_user_facing_names_map_to_the_fields_in_one_place() -> None:
    options = {"kind": "fedavg", "local_epochs": 5, "local_batch_size": 2, "lr": 0.01,
               "batchnorm": "eval"}
    protocol = Protocol.from_options(options)
    assert protocol == Protocol("fedavg", 5, 2, 0.01, "eval")
    assert protocol.options() == options
    assert Protocol().options() == {"kind": "fedsgd", "local_epochs": 1, "local_batch_size": 0,
                                    "lr": 1e-4}  # batchnorm=train stays out of point ids
    assert Protocol.from_options({"lr": 1}).learning_rate == 1.0  # `lr = 1` in TOML
    assert changes_from_options({"lr": None, "local_epochs": 3}) == {"local_epochs": 3}


def test_bad_protocols_are_refused_with_what_to_change() -> None:
    with pytest.raises(ProtocolError, match="valid: kind, local_epochs"):
        Protocol.from_options({"epochs": 2})
    with pytest.raises(ProtocolError, match="local_epochs must be an integer >= 1"):
        Protocol(local_epochs=0)
    with pytest.raises(ProtocolError, match="number"):
        Protocol(learning_rate=True)
    with pytest.raises(ProtocolError, match="unknown protocol field"):
        Protocol().with_changes({"tau": 0.1})


def test_the_wire_form_round_trips_and_reads_only_what_a_server_set() -> None:
    protocol = Protocol("fedavg", 2, 1, 0.5, "eval")
    spec = protocol_to_pb(protocol, num_images=4)
    assert spec.num_images == 4 and protocol_from_pb(spec) == protocol
    asked = pb.ProtocolSpec(local_epochs=3)
    assert changes_from_pb(asked) == ProtocolChanges(local_epochs=3)
    assert protocol.with_changes(changes_from_pb(asked)) == Protocol("fedavg", 3, 1, 0.5, "eval")
