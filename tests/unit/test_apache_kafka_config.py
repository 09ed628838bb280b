"""The properties `ApacheKafka` writes: a node alone bootstraps its own controller
quorum; a node of a static quorum names every voter and its own id."""

from __future__ import annotations

from pathlib import Path

from tests.apache_kafka import ApacheKafka


def properties(node: ApacheKafka, quorum: str = "") -> dict[str, str]:
    lines = node._write_config(quorum).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_a_node_alone_bootstraps_from_its_own_controller(tmp_path: Path) -> None:
    node = ApacheKafka(tmp_path)
    written = properties(node)
    assert written["node.id"] == "1"
    assert written["controller.quorum.bootstrap.servers"] == f"127.0.0.1:{node.controller_port}"
    assert "controller.quorum.voters" not in written


def test_a_quorum_member_names_every_voter_and_its_own_id(tmp_path: Path) -> None:
    voters = "1@127.0.0.1:9001,2@127.0.0.1:9002,3@127.0.0.1:9003"
    node = ApacheKafka(tmp_path, node_id=2)
    written = properties(node, voters)
    assert written["node.id"] == "2"
    assert written["controller.quorum.voters"] == voters
    assert "controller.quorum.bootstrap.servers" not in written
    assert written["listeners"].endswith(f"CONTROLLER://127.0.0.1:{node.controller_port}")
