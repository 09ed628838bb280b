"""Broker defaults of topic configs (`log.*`) are checked as the topic configs are, at start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.broker_process import ROOT, executable, free_port
from tierbroker.broker.config.broker_config import ConfigError, load_config
from tierbroker.broker.config.listeners import SecurityProtocol

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
    "listeners=127.0.0.1:9092": "listeners='127.0.0.1:9092': '127.0.0.1:9092' should be "
    "NAME://host:port",
    "listeners=PLAINTEXT://127.0.0.1": "listeners='PLAINTEXT://127.0.0.1': "
    "'PLAINTEXT://127.0.0.1' should be NAME://host:port",
    "listeners=PLAINTEXT://bad host:9092": "listeners='PLAINTEXT://bad host:9092': "
    "'PLAINTEXT://bad host:9092' should be NAME://host:port",
    "listeners=PLAINTEXT://127.0.0.1:70000": "listeners='PLAINTEXT://127.0.0.1:70000': port "
    "70000 is out of range: use 1 to 65535, or 0 for a free port",
    "listeners=PLAINTEXT://:9092,CONTROLLER://:9093": "listeners='PLAINTEXT://:9092,"
    "CONTROLLER://:9093': listener CONTROLLER has no security protocol",
    "listeners=PLAINTEXT://:9092,PLAINTEXT://:9093": "listeners='PLAINTEXT://:9092,"
    "PLAINTEXT://:9093': listener PLAINTEXT is given twice",
    "listeners=PLAINTEXT://:9092,SSL://:9092": "listeners='PLAINTEXT://:9092,SSL://:9092': "
    "port 9092 is given twice",
    "listeners=SSL://127.0.0.1:9093": "security.inter.broker.protocol=PLAINTEXT: no "
    "listener is named PLAINTEXT",
    "listener.security.protocol.map=INTERNAL:TLS": "listener.security.protocol.map="
    "'INTERNAL:TLS': 'INTERNAL:TLS' should be NAME:PROTOCOL",
    "inter.broker.listener.name=EXTERNAL": "inter.broker.listener.name='EXTERNAL' is not one "
    "of the listeners (PLAINTEXT)",
}


@pytest.mark.parametrize("setting, message", BAD_LISTENERS.items(), ids=BAD_LISTENERS.keys())
def test_a_bad_listener_setting_is_refused_naming_it(setting: str, message: str) -> None:
    assert refusal(setting).startswith(message)


def test_the_inter_broker_listener_is_named_or_given_by_protocol_never_both() -> None:
    assert refusal(
        "inter.broker.listener.name=PLAINTEXT", "security.inter.broker.protocol=PLAINTEXT"
    ).startswith("inter.broker.listener.name and security.inter.broker.protocol are both set")


def test_several_listeners_with_their_protocols_and_advertised_addresses() -> None:
    config = load_config(
        None,
        [
            "listeners=INTERNAL://0.0.0.0:19092,EXTERNAL://[::1]:0,SSL://127.0.0.1:19093",
            "listener.security.protocol.map=INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL,SSL:SSL",
            "advertised.listeners=EXTERNAL://broker.example:9094",
            "inter.broker.listener.name=internal",
        ],
    )
    listeners = config.listener_config
    assert [(x.name, x.security_protocol, x.host, x.port) for x in listeners.listeners] == [
        ("INTERNAL", SecurityProtocol.PLAINTEXT, "0.0.0.0", 19092),
        ("EXTERNAL", SecurityProtocol.SASL_SSL, "::1", 0),
        ("SSL", SecurityProtocol.SSL, "127.0.0.1", 19093),
    ]
    # Unadvertised listeners are advertised as bound, a wildcard host as 127.0.0.1.
    assert [str(x) for x in listeners.advertised] == [
        "INTERNAL://127.0.0.1:19092",
        "EXTERNAL://broker.example:9094",
        "SSL://127.0.0.1:19093",
    ]
    assert listeners.inter_broker == "INTERNAL"
    by_protocol = load_config(
        None,
        ["listeners=PLAINTEXT://:0,SSL://:0", "security.inter.broker.protocol=ssl"],
    )
    assert by_protocol.listener_config.inter_broker == "SSL"
    assert load_config(None, ["metrics.port=-1"]).metrics_port == -1


def test_security_settings_keep_per_listener_overrides() -> None:
    config = load_config(
        None,
        [
            "ssl.keystore.location=/etc/broker.p12",
            "listener.name.external.ssl.keystore.location=/etc/external.p12",
            "listener.name.external.plain.sasl.jaas.config=secret",
            "super.users=User:admin",
        ],
    )
    security = config.security
    assert security.get("ssl.keystore.location", "EXTERNAL") == "/etc/external.p12"
    assert security.get("ssl.keystore.location", "INTERNAL") == "/etc/broker.p12"
    assert security.get("sasl.jaas.config", "EXTERNAL", "PLAIN") == "secret"
    assert security.get("super.users") == "User:admin"
    assert "super.users" not in config.ignored_properties
    assert security.redacted()["listener.name.external.plain.sasl.jaas.config"] == "[hidden]"


def test_ports_out_of_range_and_wildcard_advertised_addresses_are_refused() -> None:
    assert refusal("metrics.port=65536") == (
        "metrics.port='65536': port 65536 is out of range: use 1 to 65535, "
        "0 for a free port, -1 for none"
    )
    assert refusal("advertised.listeners=PLAINTEXT://0.0.0.0:9092").startswith(
        "advertised.listeners='PLAINTEXT://0.0.0.0:9092': clients cannot connect to the "
        "wildcard address of PLAINTEXT"
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
