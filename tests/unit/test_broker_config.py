"""Broker defaults of topic configs (`log.*`) are checked as the topic configs are, at start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.broker_process import ROOT, executable, free_port
from tierbroker.broker.config.broker_config import ConfigError, load_config

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


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as refused:
        load_config(None, list(overrides))
    return str(refused.value)


def test_an_unknown_property_is_refused_with_the_name_it_may_mean() -> None:
    assert refusal("listners=PLAINTEXT://127.0.0.1:9092") == (
        "unknown property 'listners': did you mean 'listeners'? "
        "(a plugin's own settings go under rsm.config.* or rlmm.config.*)"
    )
    assert "did you mean 'metrics.port'?" in refusal("metrics.prot=9405")
    assert "did you mean 'log.retention.ms'?" in refusal("retention.ms=1000")  # a topic config
    assert "'zzz.top': check its spelling" in refusal("zzz.top=1")


def test_kafka_configs_without_effect_are_accepted_and_noted() -> None:
    config = load_config(
        None,
        [
            "num.io.threads=8",
            "num.network.threads=3",
            "rsm.config.any.plugin.setting=1",
            "rlmm.config.another=2",
            "listener.name.plaintext.some.setting=x",
        ],
    )
    assert config.ignored_properties == ("num.io.threads", "num.network.threads")
    assert config.rsm_configs == {"any.plugin.setting": "1"}
    assert config.rlmm_configs == {"another": "2"}


@pytest.mark.parametrize("value", ["yes", "1", "on", "", "truthy"])
def test_a_boolean_is_true_or_false_only(value: str) -> None:
    assert refusal(f"auto.create.topics.enable={value}") == (
        f"auto.create.topics.enable={value!r}: must be true or false"
    )


def test_booleans_ignore_case_as_kafka_does() -> None:
    config = load_config(None, ["delete.topic.enable=FALSE", "auto.create.topics.enable=True"])
    assert config.delete_topic_enable is False and config.auto_create_topics_enable is True


BAD_LISTENERS = {
    "SSL://127.0.0.1:9093": "SSL is not supported, tierbroker speaks PLAINTEXT only: "
    "use PLAINTEXT://host:port",
    "SASL_PLAINTEXT://:9093": "SASL_PLAINTEXT is not supported",
    "127.0.0.1:9092": "expected PLAINTEXT://host:port",
    "PLAINTEXT://127.0.0.1": "expected PLAINTEXT://host:port",
    "PLAINTEXT://bad host:9092": "expected PLAINTEXT://host:port",
    "PLAINTEXT://127.0.0.1:70000": "port 70000 is out of range: use 1 to 65535, or 0 for a "
    "free port",
    "PLAINTEXT://:9092,CONTROLLER://:9093": "tierbroker serves exactly one listener",
}


@pytest.mark.parametrize("value, message", BAD_LISTENERS.items(), ids=BAD_LISTENERS.keys())
def test_a_bad_or_unsupported_listener_is_refused(value: str, message: str) -> None:
    assert refusal(f"listeners={value}").startswith(f"listeners={value!r}: {message}")


def test_listeners_and_ports_that_are_accepted() -> None:
    assert load_config(None, ["listeners=PLAINTEXT://[::1]:0"]).listener == ("::1", 0)
    config = load_config(None, ["listeners=plaintext://0.0.0.0:19092"])
    assert config.listener == ("0.0.0.0", 19092)
    assert config.advertised_listener == ("127.0.0.1", 19092)
    assert load_config(None, ["metrics.port=-1"]).metrics_port == -1


def test_ports_out_of_range_and_wildcard_advertised_addresses_are_refused() -> None:
    assert refusal("metrics.port=65536") == (
        "metrics.port='65536': port 65536 is out of range: use 1 to 65535, "
        "0 for a free port, -1 for none"
    )
    assert refusal("advertised.listeners=PLAINTEXT://0.0.0.0:9092").startswith(
        "advertised.listeners='PLAINTEXT://0.0.0.0:9092': clients cannot connect to a wildcard"
    )


def test_the_defaults_tier_to_a_directory_inside_the_log_dir_with_metrics_on() -> None:
    from tierbroker.broker.server.remote_storage import local_remote_dir

    config = load_config(None, ["log.dirs=/srv/data"])
    assert config.remote_log_storage_system_enable is True
    assert config.remote_log_storage_manager_class_name == "localfs"
    assert config.metrics_port == 9404
    assert local_remote_dir(config) == Path("/srv/data/remote")
    shipped = load_config(ROOT / "config" / "server.properties", [])
    assert local_remote_dir(shipped) == Path("./data/remote")


def test_a_config_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "missing.properties", [])
    assert str(refused.value) == (
        f"--config {tmp_path / 'missing.properties'}: cannot read it (No such file or directory)"
    )
