"""`GroupMetadata` and `MemberMetadata`: one classic consumer group and its members.

States and their allowed transitions, as in Kafka's GroupMetadata::

    Empty -----------------> PreparingRebalance <-----------------+
      ^                         |      ^                          |
      |                         v      |                          |
      +---- (all left) --- CompletingRebalance ---> Stable -------+
    any state -> Dead (group deleted, or moved away)

Invariant: the generation grows by one each time a rebalance completes. Waiters
(a JoinGroup or SyncGroup response in flight) are futures on the member; the
coordinator resolves every one of them whatever happens to the group. Not shared
between tasks beyond the event loop: the coordinator owns all groups.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from tierbroker.broker.coordinator.group.subscription import subscribed_topics
from tierbroker.protocol.errors import ErrorCode


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # (member id, instance id, metadata)
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(slots=True, kw_only=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[SyncResult] | None = None
    heartbeat_timer: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None and not self.join_waiter.done()

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise KeyError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass(slots=True)
class GroupMetadata:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    # KIP-394: ids given, not joined yet, each with the timer that forgets it.
    pending_members: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    state_timestamp_ms: int = -1
    rebalance_timer: asyncio.TimerHandle | None = None
    initial_delay: bool = False  # in group.initial.rebalance.delay.ms after leaving Empty

    def drop_pending(self, member_id: str) -> bool:
        """Forget a pending member id and cancel its timer; whether it was pending."""
        timer = self.pending_members.pop(member_id, None)
        if timer is not None:
            timer.cancel()
        return timer is not None

    def drop_all_pending(self) -> None:
        for member_id in list(self.pending_members):
            self.drop_pending(member_id)

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise RuntimeError(f"group {self.group_id}: invalid transition {self.state} -> {state}")
        self.state = state
        self.state_timestamp_ms = now_ms

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    @property
    def all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """A new member fits if the type matches and it shares a protocol with every member."""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        return all(names & {n for n, _ in m.protocols} for m in self.members.values())

    def select_protocol(self) -> str:
        """The protocol every member supports that gets the most first-preference votes."""
        candidates = set.intersection(*({n for n, _ in m.protocols} for m in self.members.values()))
        votes: dict[str, int] = dict.fromkeys(candidates, 0)
        for member in self.members.values():
            preferred = next(name for name, _ in member.protocols if name in candidates)
            votes[preferred] += 1
        return max(sorted(votes), key=lambda name: votes[name])

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol), or None if unknown."""
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            try:
                topics |= subscribed_topics(member.metadata_for(self.protocol_name))
            except (KeyError, ValueError):
                return None
        return topics

    def describe_members(self) -> list[dict[str, Any]]:
        return [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata_for(self.protocol_name)
                if self.protocol_name
                else b"",
                "member_assignment": m.assignment,
            }
            for m in self.members.values()
        ]
