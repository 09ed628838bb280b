"""Broker defaults of topic configs (`log.*`) are checked as the topic configs are, at start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.broker_process import ROOT, executable, free_port
from tierbroker.broker.config import ConfigError, load_config

BAD_DEFAULTS = {
    "log.segment.bytes=0": "log.segment.bytes='0': must be an integer >= 14",
    "log.roll.hours=0": "log.roll.hours='0': must be an integer >= 1",
    "log.roll.ms=-5": "log.roll.ms='-5': must be an integer >= 1",
    "log.retention.bytes=ten": "log.retention.bytes='ten': must be an integer",
    "log.retention.hours=2.5": "log.retention.hours='2.5': must be an integer",
    "log.message.timestamp.type=Now": (
        "log.message.timestamp.type='Now': must be CreateTime or LogAppendTime"
    ),
    "log.index.size.max.bytes=3": "log.index.size.max.bytes='3': must be an integer >= 4",
}


@pytest.mark.parametrize("override, message", BAD_DEFAULTS.items(), ids=BAD_DEFAULTS.keys())
def test_an_invalid_topic_default_fails_at_load_naming_the_property(
    override: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, [override])
    assert str(refused.value).startswith(message)


def test_valid_topic_defaults_are_kept_in_the_topic_configs_units() -> None:
    config = load_config(
        ROOT / "config" / "server.properties",
        ["log.retention.hours=-1", "log.roll.hours=2", "log.segment.bytes=14"],
    )
    assert config.log_defaults["retention.ms"] == -1  # any negative retention: unlimited
    assert config.log_defaults["segment.ms"] == 7_200_000
    assert config.log_defaults["segment.bytes"] == 14


def test_the_cli_refuses_to_start_with_one_line_and_exit_code_2(tmp_path: Path) -> None:
    serve = [executable("tierbroker", "pip install -e ."), "serve"]
    for override in (f"log.dirs={tmp_path}", f"listeners=PLAINTEXT://127.0.0.1:{free_port()}"):
        serve += ["--override", override]
    done = subprocess.run(
        [*serve, "--override", "log.segment.bytes=0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: log.segment.bytes='0': must be an integer >= 14"
    ]
