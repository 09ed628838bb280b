"""An unexpected error in one controller event: the controller answers its caller and goes
on electing; after repeated failures it resigns and a fresh term takes over."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.unit.broker import running_broker
from tierbroker.broker.controller import controller as controller_module
from tierbroker.broker.controller.controller import Controller, NotController
from tierbroker.broker.controller.leader_election import ElectionType
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.inprocess_store import InProcessSession
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition

BOUND_S = 20.0  # bounds a wait that would otherwise hang; never asserted


def failing(times: int, real: Any) -> Any:
    """A handler that raises its first `times` calls, then is `real`."""
    calls = {"n": 0}

    async def handler(self: Controller, *args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= times:
            raise RuntimeError("injected")
        return await real(self, *args)

    return handler


async def test_a_failing_event_answers_its_caller_and_the_next_election_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path) as broker:
        await broker.admin.create_topic("t", 1, 1, {})
        tp = TopicPartition("t", 0)
        monkeypatch.setattr(Controller, "_on_election", failing(1, Controller._on_election))
        async with asyncio.timeout(BOUND_S):
            with pytest.raises(NotController):
                await broker.controller.elect_leaders(ElectionType.PREFERRED, [tp])
            outcomes = await broker.controller.elect_leaders(ElectionType.PREFERRED, [tp])
        assert outcomes[tp].error == ErrorCode.election_not_needed
        assert broker.controller.is_active


async def test_repeated_failures_resign_and_a_fresh_term_elects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path) as broker:
        controller = broker.controller
        first_epoch = controller.epoch
        failures = controller_module.MAX_EVENT_FAILURES
        monkeypatch.setattr(Controller, "_on_election", failing(failures, Controller._on_election))
        tp = TopicPartition("t", 0)
        async with asyncio.timeout(BOUND_S):
            for _ in range(failures):
                with pytest.raises(NotController):
                    await controller.elect_leaders(ElectionType.PREFERRED, [tp])
            # Led once created: only a fresh term of the one broker can have elected it.
            await broker.admin.create_topic("t", 1, 1, {})
            outcomes = await controller.elect_leaders(ElectionType.PREFERRED, [tp])
        assert outcomes[tp].error == ErrorCode.election_not_needed
        assert controller.epoch > first_epoch


async def test_a_topic_znode_another_tool_wrote_does_not_stop_elections(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path) as broker:
        await broker.controller.store.create(zk.topic_path("a-junk"), b"not json")
        async with asyncio.timeout(BOUND_S):
            await broker.admin.create_topic("t", 2, 1, {})
        assert broker.cache.has_leaders("t")
        assert broker.controller.is_active


async def test_a_caller_whose_controller_resigns_mid_event_gets_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path) as broker:
        started, never = asyncio.Event(), asyncio.Event()

        async def stuck(self: Controller, *_args: Any) -> None:
            started.set()
            await never.wait()

        monkeypatch.setattr(Controller, "_on_election", stuck)
        asking = asyncio.ensure_future(
            broker.controller.elect_leaders(ElectionType.PREFERRED, [TopicPartition("t", 0)])
        )
        async with asyncio.timeout(BOUND_S):
            await started.wait()
            store = broker.controller.store
            assert isinstance(store, InProcessSession)
            await store.expire()
            with pytest.raises(NotController):
                await asking
