"""`GroupCoordinator.stop`: the coordinator owns its tasks and timers, and none outlives
it: group loads are cancelled and awaited, KIP-394 pending-member timers cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

from tierbroker.broker.coordinator.group.coordinator import (
    GroupConfig,
    GroupCoordinator,
    JoinRequest,
)
from tierbroker.protocol.errors import ErrorCode


class Topic:
    exists = True


class Store:
    """The few `GroupMetadataManager` parts a coordinator with no stored groups uses."""

    def __init__(self) -> None:
        self.topic = Topic()
        self.offsets: dict[str, Any] = {}

    def partition_of(self, group_id: str) -> int:
        return 0

    def load_partition(self, partition: int) -> dict[str, Any]:
        return {}

    def unload_partition(self, partition: int) -> None:
        pass


def coordinator() -> GroupCoordinator:
    return GroupCoordinator(GroupConfig(), Store(), lambda tp: True)  # type: ignore[arg-type]


def test_stop_cancels_and_awaits_group_loads() -> None:
    async def run() -> list[asyncio.Task[Any]]:
        groups = coordinator()
        groups.start()
        groups.on_leadership(0, True)  # the load runs on the next loop iteration

        await groups.stop()

        return [t for t in asyncio.all_tasks() if t.get_name().startswith("load-groups")]

    assert asyncio.run(run()) == []


def test_stop_cancels_pending_member_timers() -> None:
    async def run() -> list[asyncio.TimerHandle]:
        loop = asyncio.get_running_loop()
        timers: list[asyncio.TimerHandle] = []
        call_later = loop.call_later

        def recording(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            timers.append(call_later(delay, callback, *args))
            return timers[-1]

        groups = coordinator()
        groups.start()
        groups.on_leadership(0, True)
        await asyncio.gather(*(t for t in asyncio.all_tasks() if t.get_name() == "load-groups-0"))
        assert not groups.loading
        loop.call_later = recording  # type: ignore[method-assign]
        result = await groups.join_group(
            JoinRequest(
                group_id="g",
                member_id="",
                group_instance_id=None,
                client_id="c",
                client_host="h",
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                protocol_type="consumer",
                protocols=[("range", b"")],
                require_known_member_id=True,
                supports_skip_assignment=False,
            )
        )
        assert result.error == ErrorCode.member_id_required
        assert timers

        await groups.stop()

        return [t for t in timers if not t.cancelled()]

    assert asyncio.run(run()) == []
