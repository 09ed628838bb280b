"""The preflight: what the broker needs from the machine, checked before it writes anything,
each failure one `ConfigError` naming the property and the fix."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import STORE_PASSWORD, session_certs
from tierbroker.broker.config.broker_config import ConfigError, load_config
from tierbroker.broker.server.preflight import bind_ports, preflight
from tierbroker.broker.server.remote_storage import LOCAL_REMOTE_DIR, local_remote_dir
from tierbroker.storage.log_manager import LogManager


def config_for(tmp_path: Path, *overrides: str) -> list[str]:
    return [
        f"log.dirs={tmp_path / 'data'}",
        "listeners=PLAINTEXT://127.0.0.1:0",
        "metrics.port=0",
        *overrides,
    ]


def refused(tmp_path: Path, *overrides: str) -> str:
    """The message of the preflight's refusal; the data dir was not created."""
    with pytest.raises(ConfigError) as e:
        preflight([load_config(None, config_for(tmp_path, *overrides))])
    assert not (tmp_path / "data").exists()
    return str(e.value)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield int(s.getsockname()[1])


def test_a_good_config_binds_free_ports_and_writes_nothing(tmp_path: Path) -> None:
    [ports] = preflight([load_config(None, config_for(tmp_path))], tmp_path / "ports.json")
    try:
        assert ports.port > 0 and ports.metrics_port is not None and ports.metrics_port > 0
        assert ports.port != ports.metrics_port
        assert list(tmp_path.iterdir()) == []
    finally:
        ports.close()


def test_a_port_in_use_names_the_listener(tmp_path: Path, taken_port: int) -> None:
    message = refused(tmp_path, f"listeners=PLAINTEXT://127.0.0.1:{taken_port}")
    assert message.startswith(f"listeners='PLAINTEXT://127.0.0.1:{taken_port}': ")
    assert f"port {taken_port} on 127.0.0.1 is in use" in message


def test_a_metrics_port_in_use_names_it_and_frees_the_listener(
    tmp_path: Path, taken_port: int
) -> None:
    message = refused(tmp_path, f"metrics.port={taken_port}")
    assert message.startswith(f"metrics.port={taken_port}: port {taken_port}")
    # The broker's port, bound first, was closed: the test's warnings-as-errors would see
    # an unclosed socket.


def test_the_metrics_port_cannot_be_the_listeners(tmp_path: Path, taken_port: int) -> None:
    message = refused(
        tmp_path, f"listeners=PLAINTEXT://127.0.0.1:{taken_port}", f"metrics.port={taken_port}"
    )
    assert message.startswith(f"metrics.port={taken_port}: a listener uses that port")


def test_an_address_not_of_this_machine_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, "listeners=PLAINTEXT://192.0.2.1:0")  # TEST-NET-1
    assert "192.0.2.1 is not an address of this machine" in message


def test_log_dirs_that_cannot_be_used(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    message = refused(tmp_path, f"log.dirs={a_file}")
    assert message == (
        f"log.dirs: {a_file} is not a directory: set log.dirs to a directory this user can write"
    )
    message = refused(tmp_path, f"log.dirs={tmp_path / 'ok'},{a_file / 'logs'}")
    assert message.startswith(f"log.dirs: {a_file / 'logs'} cannot be created: {a_file} is not")
    assert not (tmp_path / "ok").exists()


def test_a_log_dir_in_a_directory_no_one_may_write_is_refused(tmp_path: Path) -> None:
    read_only = Path("/proc/self")  # procfs refuses new entries, even to root
    message = refused(tmp_path, f"log.dirs={read_only / 'logs'}")
    assert message.startswith(f"log.dirs: {read_only / 'logs'} cannot be")


def test_a_log_dir_the_file_system_refuses_to_create_names_log_dirs(tmp_path: Path) -> None:
    # root may write in /proc by its mode, yet procfs refuses the new directory
    message = refused(tmp_path, "log.dirs=/proc/x")
    assert message == (
        "log.dirs: /proc/x cannot be used (No such file or directory): "
        "set log.dirs to a directory this user can write"
    )


def test_plugins_that_do_not_load_list_the_accepted_names(tmp_path: Path) -> None:
    message = refused(tmp_path, "remote.log.storage.manager.class.name=nosuch.Storage")
    assert message.startswith("remote.log.storage.manager.class.name='nosuch.Storage': cannot")
    assert message.endswith("use localfs, s3, or package.module.Class of a RemoteStorageManager")
    message = refused(tmp_path, "remote.log.metadata.manager.class.name=pathlib.Path")
    assert message == (
        "remote.log.metadata.manager.class.name='pathlib.Path': not a "
        "RemoteLogMetadataManager: use topic, or package.module.Class of a "
        "RemoteLogMetadataManager"
    )


def test_kafkas_own_metadata_manager_name_is_the_topic_based_one(tmp_path: Path) -> None:
    kafka_default = (
        "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"
    )
    config = config_for(tmp_path, f"remote.log.metadata.manager.class.name={kafka_default}")
    [ports] = preflight([load_config(None, config)])
    ports.close()


def test_plugins_are_not_checked_with_the_remote_tier_off(tmp_path: Path) -> None:
    overrides = (
        "remote.log.storage.system.enable=false",
        "remote.log.storage.manager.class.name=x",
    )
    [ports] = preflight([load_config(None, config_for(tmp_path, *overrides))])
    ports.close()


def test_s3_settings_are_named_in_full(tmp_path: Path) -> None:
    s3 = "remote.log.storage.manager.class.name=s3"
    message = refused(tmp_path, s3)
    assert message.startswith(
        "rsm.config.storage.s3.bucket.name is required by remote.log.storage.manager.class.name=s3"
    )
    bucket = "rsm.config.storage.s3.bucket.name=b"
    message = refused(tmp_path, s3, bucket, "rsm.config.storage.s3.retry.max.attempts=zero")
    assert message == (
        "remote.log.storage.manager.class.name=s3: "
        "rsm.config.storage.s3.retry.max.attempts='zero' is not an integer"
    )
    message = refused(tmp_path, s3, bucket, "rsm.config.storage.aws.access.key.id=k")
    assert message.endswith(
        "rsm.config.storage.aws.access.key.id and rsm.config.storage.aws.secret.access.key "
        "go together"
    )


def test_a_local_remote_dir_named_like_a_partition_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, f"rsm.config.dir={tmp_path / 'data' / 'tiered-0'}")
    assert message == (
        f"rsm.config.dir={tmp_path / 'data' / 'tiered-0'}: inside a log dir, a name of the "
        "form <topic>-<partition> would be loaded as a partition: choose another name"
    )
    # Elsewhere, any name will do; and one that cannot be written is the remote store's
    # health, a warning at start (the local tier serves without it).
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for remote in (tmp_path / "tiered-0", a_file / "remote"):
        [ports] = preflight([load_config(None, config_for(tmp_path, f"rsm.config.dir={remote}"))])
        ports.close()


def test_the_default_remote_dir_is_inside_the_log_dir_and_never_loaded_as_a_log(
    tmp_path: Path,
) -> None:
    config = load_config(None, config_for(tmp_path))
    remote = local_remote_dir(config)
    assert remote == tmp_path / "data" / LOCAL_REMOTE_DIR
    # What LocalFs keeps there survives loading the log dir, and is not taken for a log.
    segment = remote / "cluster" / "events-id" / "0" / "00000000000000000000-x.log"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"remote bytes")
    manager = LogManager(config.log_dir_paths)
    manager.load_logs(lambda tp: None)  # every partition dir of an unknown topic is removed
    assert manager.logs == {}
    assert segment.read_bytes() == b"remote bytes"


def test_bind_ports_without_metrics(tmp_path: Path) -> None:
    ports = bind_ports(load_config(None, config_for(tmp_path, "metrics.port=-1")))
    try:
        assert ports.metrics is None and ports.metrics_port is None
    finally:
        ports.close()


def test_a_host_name_binds_its_ipv4_address(tmp_path: Path) -> None:
    ports = bind_ports(load_config(None, config_for(tmp_path, "listeners=PLAINTEXT://localhost:0")))
    try:
        assert ports.listeners["PLAINTEXT"].getsockname()[0] == "127.0.0.1"
        assert ports.metrics is not None and ports.metrics.getsockname()[0] == "127.0.0.1"
    finally:
        ports.close()


def test_tls_listener_stores_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    certs = session_certs()
    tls = ("listeners=PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",)
    assert "listener SSL uses TLS and has no key store" in refused(tmp_path, *tls)
    wrong = (f"ssl.keystore.location={certs.broker.p12}", "ssl.keystore.password=wrong")
    assert "or the password is wrong" in refused(tmp_path, *tls, *wrong)
    inter_broker = (
        "listeners=SSL://127.0.0.1:0",
        "security.inter.broker.protocol=SSL",
        f"ssl.keystore.location={certs.broker.p12}",
        f"ssl.keystore.password={STORE_PASSWORD}",
        "ssl.endpoint.identification.algorithm=ldaps",
    )
    assert "ssl.endpoint.identification.algorithm=ldaps: use https" in refused(
        tmp_path, *inter_broker
    )
