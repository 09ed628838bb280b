"""`GroupCoordinator`: the classic consumer-group protocol, as Kafka's GroupCoordinator runs it.

Members join (JoinGroup), the leader's assignment is relayed (SyncGroup), and
heartbeats keep members alive until they leave or their session times out. The
broker never computes an assignment: the group leader does, with whatever
assignor the members agreed on. Completed generations go through the
`GroupMetadataManager` to `__consumer_offsets`; committed offsets, and deleting groups,
are `offsets` (`GroupOffsets`).

A group is coordinated by the leader of its `__consumer_offsets` partition: when this
broker becomes that leader it loads the partition's groups (COORDINATOR_LOAD_IN_PROGRESS
meanwhile), and when it stops leading it, it drops them, answering their waiters
NOT_COORDINATOR, so members find the new coordinator.

All state lives on the event loop: joins and syncs wait on futures held by the
member, timers are loop handles held by the member or group, and every waiter is
resolved when its member is removed or the coordinator stops.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

from tierbroker.broker.coordinator.group.group import (
    GroupMetadata,
    GroupState,
    JoinResult,
    MemberMetadata,
    SyncResult,
)
from tierbroker.broker.coordinator.group.offset_commits import GroupOffsets
from tierbroker.broker.coordinator.group.offsets_store import GroupMetadataManager
from tierbroker.broker.coordinator.group.records import GroupValue, MemberValue
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log import now_ms
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

Empty, Preparing, Completing, Stable = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE,
)


@dataclass(frozen=True, slots=True)
class GroupConfig:
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_size: int = 2**31 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    require_known_member_id: bool
    supports_skip_assignment: bool


class GroupCoordinator:
    def __init__(
        self,
        config: GroupConfig,
        store: GroupMetadataManager,
        topic_exists: Callable[[TopicPartition], bool],
    ) -> None:
        self.config = config
        self.store = store
        self.topic_exists = topic_exists
        self.groups: dict[str, GroupMetadata] = {}
        self.active = False
        self.owned: set[int] = set()  # partitions of __consumer_offsets led and loaded here
        self.loading: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.offsets = GroupOffsets(store, self.groups, topic_exists, self.coordinator_error)

    # Lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.active = True

    def on_leadership(self, partition: int, leader: bool) -> None:
        """This broker started or stopped leading a partition of `__consumer_offsets`."""
        if leader:
            self.loading.add(partition)
            self._run(self._load(partition), f"load-groups-{partition}")
        else:
            self._unload(partition)

    def _run(self, work: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, partition: int) -> None:
        """Rebuild the partition's groups; loaded members must heartbeat to stay."""
        await asyncio.sleep(0)  # after the leadership change that asked for it
        if partition not in self.loading:
            return
        loaded = self.store.load_partition(partition)
        for group_id, value in loaded.items():
            group = GroupMetadata(
                group_id,
                generation_id=value.generation,
                protocol_type=value.protocol_type or None,
                protocol_name=value.protocol,
                leader_id=value.leader,
                state_timestamp_ms=value.current_state_timestamp_ms,
            )
            for m in value.members:
                member = MemberMetadata(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout_ms=m.rebalance_timeout_ms,
                    session_timeout_ms=m.session_timeout_ms,
                    protocol_type=value.protocol_type,
                    protocols=[(value.protocol or "", m.subscription)],
                    assignment=m.assignment,
                )
                self._add_member(group, member)
                self._schedule_session_expiry(group, member)
            group.state = Stable if group.members else Empty
            self.groups[group_id] = group
        for group_id in self.store.offsets:
            if self.store.partition_of(group_id) == partition:
                self.groups.setdefault(
                    group_id, GroupMetadata(group_id, state_timestamp_ms=now_ms())
                )
        self.loading.discard(partition)
        self.owned.add(partition)
        # Fifty empty partitions at every start are not worth fifty lines at INFO.
        log.log(
            logging.INFO if loaded else logging.DEBUG,
            "loaded %d groups from __consumer_offsets-%d",
            len(loaded),
            partition,
        )

    def _unload(self, partition: int) -> None:
        self.loading.discard(partition)
        if partition not in self.owned:
            return
        self.owned.discard(partition)
        gone = [g for g in self.groups.values() if self.store.partition_of(g.group_id) == partition]
        for group in gone:
            self._drop(group)
            del self.groups[group.group_id]
        self.store.unload_partition(partition)
        log.info("gave up %d groups of __consumer_offsets-%d", len(gone), partition)

    def _drop(self, group: GroupMetadata) -> None:
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
        group.drop_all_pending()
        for member in group.members.values():
            self._cancel_member(member, ErrorCode.not_coordinator)

    async def stop(self) -> None:
        """Cancel every timer and answer every waiter: this broker stops coordinating.
        Returns once every group load it started has ended."""
        self.active = False
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for group in self.groups.values():
            self._drop(group)
        await asyncio.gather(*tasks, return_exceptions=True)

    def hosts(self, partition: int) -> bool:
        """Whether this broker loads or owns the groups of `partition` of `__consumer_offsets`."""
        return partition in self.owned or partition in self.loading

    def coordinator_error(self, group_id: str) -> ErrorCode:
        """NONE if this broker coordinates `group_id` now, else what the client is told."""
        if not self.active or not self.store.topic.exists:
            return ErrorCode.not_coordinator
        partition = self.store.partition_of(group_id)
        if partition in self.loading:
            return ErrorCode.coordinator_load_in_progress
        if partition not in self.owned:
            return ErrorCode.not_coordinator
        return ErrorCode.none

    # JoinGroup -----------------------------------------------------------------------

    async def join_group(self, req: JoinRequest) -> JoinResult:
        if not req.group_id:
            return JoinResult(ErrorCode.invalid_group_id, member_id=req.member_id)
        error = self.coordinator_error(req.group_id)
        if error != ErrorCode.none:
            return JoinResult(error, member_id=req.member_id)
        c = self.config
        if not c.min_session_timeout_ms <= req.session_timeout_ms <= c.max_session_timeout_ms:
            log.info(
                "join %s: session timeout %d ms outside [%d, %d]",
                req.group_id,
                req.session_timeout_ms,
                c.min_session_timeout_ms,
                c.max_session_timeout_ms,
            )
            return JoinResult(ErrorCode.invalid_session_timeout, member_id=req.member_id)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return JoinResult(ErrorCode.unknown_member_id, member_id=req.member_id)
            group = self.groups[req.group_id] = GroupMetadata(
                req.group_id, state_timestamp_ms=now_ms()
            )
        if not group.supports_protocols(req.protocol_type, req.protocols):
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=req.member_id)
        if req.member_id:
            return await self._join_known_member(group, req)
        return await self._join_new_member(group, req)

    async def _join_new_member(self, group: GroupMetadata, req: JoinRequest) -> JoinResult:
        member_id = f"{req.client_id}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            old_id = group.static_members.get(req.group_instance_id)
            if old_id is not None and old_id in group.members:
                return await self._rejoin_static_member(group, old_id, member_id, req)
        elif req.require_known_member_id:
            # KIP-394: hand out the id first, so a member that never returns costs nothing.
            group.pending_members[member_id] = asyncio.get_running_loop().call_later(
                req.session_timeout_ms / 1000, self._expire_pending_member, group, member_id
            )
            return JoinResult(ErrorCode.member_id_required, member_id=member_id)
        if len(group.members) >= self.config.max_size:
            return JoinResult(ErrorCode.group_max_size_reached, member_id=member_id)
        member = self._new_member(req, member_id)
        return await self._add_member_and_rebalance(group, member)

    async def _join_known_member(self, group: GroupMetadata, req: JoinRequest) -> JoinResult:
        member = group.members.get(req.member_id)
        if member is None:
            if group.drop_pending(req.member_id):
                return await self._add_member_and_rebalance(
                    group, self._new_member(req, req.member_id)
                )
            return JoinResult(ErrorCode.unknown_member_id, member_id=req.member_id)
        if member.group_instance_id != req.group_instance_id:
            return JoinResult(ErrorCode.fenced_instance_id, member_id=req.member_id)
        if group.is_in(Completing) and member.matches(req.protocols):
            return self._join_result(group, member)  # the member missed its JoinGroup answer
        if (
            group.is_in(Stable)
            and member.matches(req.protocols)
            and member.member_id != group.leader_id
        ):
            return self._join_result(group, member)
        member.protocols = req.protocols
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        waiter = self._await_join(member)
        if not group.is_in(Preparing):
            self._prepare_rebalance(group, f"member {member.member_id} rejoined")
        self._maybe_complete_join(group)
        return await waiter

    async def _rejoin_static_member(
        self, group: GroupMetadata, old_id: str, new_id: str, req: JoinRequest
    ) -> JoinResult:
        """A static member came back with a new member id: replace the old one in place."""
        old = group.members.pop(old_id)
        self._cancel_member(old, ErrorCode.fenced_instance_id)
        member = self._new_member(req, new_id)
        member.assignment = old.assignment
        self._add_member(group, member)
        if group.leader_id == old_id:
            group.leader_id = new_id
        log.info(
            "group %s: static member %s rejoined as %s",
            group.group_id,
            req.group_instance_id,
            new_id,
        )
        # As Kafka: no rebalance while the group's protocol is still supported. The metadata
        # may differ (a restarted consumer owns no partitions yet); the assignment stands.
        still_supported = group.protocol_name in {name for name, _ in req.protocols}
        if group.is_in(Stable) and still_supported:
            if new_id != group.leader_id or req.supports_skip_assignment:
                self._schedule_session_expiry(group, member)
                await self._persist_or_log(group)
                return self._join_result(group, member, skip_assignment=new_id == group.leader_id)
        waiter = self._await_join(member)
        if not group.is_in(Preparing):
            self._prepare_rebalance(group, f"static member {req.group_instance_id} rejoined")
        self._maybe_complete_join(group)
        return await waiter

    def _new_member(self, req: JoinRequest, member_id: str) -> MemberMetadata:
        return MemberMetadata(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=req.protocols,
        )

    def _add_member(self, group: GroupMetadata, member: MemberMetadata) -> None:
        if not group.members:
            group.protocol_type = member.protocol_type
        group.members[member.member_id] = member
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member.member_id
        if group.leader_id is None or group.leader_id not in group.members:
            group.leader_id = member.member_id

    async def _add_member_and_rebalance(
        self, group: GroupMetadata, member: MemberMetadata
    ) -> JoinResult:
        self._add_member(group, member)
        waiter = self._await_join(member)
        if not group.is_in(Preparing):
            self._prepare_rebalance(group, f"member {member.member_id} joined")
        self._maybe_complete_join(group)
        return await waiter

    def _await_join(self, member: MemberMetadata) -> asyncio.Future[JoinResult]:
        if member.awaiting_join:
            assert member.join_waiter is not None
            member.join_waiter.set_result(
                JoinResult(ErrorCode.rebalance_in_progress, member_id=member.member_id)
            )
        member.join_waiter = asyncio.get_running_loop().create_future()
        self._cancel_session_expiry(member)  # a member waiting for a rebalance is not expired
        return member.join_waiter

    def _join_result(
        self, group: GroupMetadata, member: MemberMetadata, skip_assignment: bool = False
    ) -> JoinResult:
        is_leader = member.member_id == group.leader_id
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if is_leader and group.protocol_name is not None:
            members = tuple(
                (m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
                for m in group.members.values()
            )
        return JoinResult(
            ErrorCode.none,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader_id=group.leader_id or "",
            member_id=member.member_id,
            members=members,
            skip_assignment=skip_assignment,
        )

    # Rebalancing ---------------------------------------------------------------------

    def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.is_in(Completing):
            for member in group.members.values():
                member.assignment = b""
                self._resolve_sync(member, SyncResult(ErrorCode.rebalance_in_progress))
        initial = group.is_in(Empty) and self.config.initial_rebalance_delay_ms > 0
        delay_ms = self.config.initial_rebalance_delay_ms if initial else group.rebalance_timeout_ms
        group.transition_to(Preparing, now_ms())
        group.initial_delay = initial
        log.info(
            "group %s: preparing to rebalance generation %d (%s)",
            group.group_id,
            group.generation_id + 1,
            reason,
        )
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
        group.rebalance_timer = asyncio.get_running_loop().call_later(
            delay_ms / 1000, self._on_rebalance_timer, group
        )

    def _maybe_complete_join(self, group: GroupMetadata) -> None:
        if group.is_in(Preparing) and not group.initial_delay and group.all_members_joined:
            self._complete_join(group)

    def _on_rebalance_timer(self, group: GroupMetadata) -> None:
        group.rebalance_timer = None
        if not group.is_in(Preparing):
            return
        if group.initial_delay:
            group.initial_delay = False
            if not group.all_members_joined:
                group.rebalance_timer = asyncio.get_running_loop().call_later(
                    group.rebalance_timeout_ms / 1000, self._on_rebalance_timer, group
                )
                return
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            log.info("group %s: member %s did not rejoin in time", group.group_id, member.member_id)
            self._remove_member(group, member, ErrorCode.unknown_member_id)
        group.drop_all_pending()
        self._complete_join(group)

    def _complete_join(self, group: GroupMetadata) -> None:
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
            group.rebalance_timer = None
        group.generation_id += 1
        if not group.members:
            group.protocol_name = group.leader_id = None
            group.transition_to(Empty, now_ms())
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            self._run(self._persist_or_log(group), f"store-group-{group.group_id}")
            return
        group.protocol_name = group.select_protocol()
        group.transition_to(Completing, now_ms())
        log.info(
            "group %s: generation %d with %d members, protocol %s",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.protocol_name,
        )
        for member in group.members.values():
            if member.join_waiter is not None and not member.join_waiter.done():
                member.join_waiter.set_result(self._join_result(group, member))
            member.join_waiter = None
            self._schedule_session_expiry(group, member)

    # SyncGroup -----------------------------------------------------------------------

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        error = self.coordinator_error(group_id)
        if error != ErrorCode.none:
            return SyncResult(error)
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return SyncResult(ErrorCode.unknown_member_id)
        member = group.members[member_id]
        if member.group_instance_id != group_instance_id:
            return SyncResult(ErrorCode.fenced_instance_id)
        if generation_id != group.generation_id:
            return SyncResult(ErrorCode.illegal_generation)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(ErrorCode.inconsistent_group_protocol)
        if group.is_in(Preparing):
            return SyncResult(ErrorCode.rebalance_in_progress)
        if group.is_in(Stable):
            self._schedule_session_expiry(group, member)
            return self._sync_result(group, member)
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        member.sync_waiter = waiter
        self._schedule_session_expiry(group, member)
        if member_id == group.leader_id:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            try:
                await self._persist(group)
            except KafkaError as e:
                log.warning(
                    "group %s: storing generation %d failed: %s",
                    group.group_id,
                    generation_id,
                    e,
                )
                if self._still_completing(group, generation_id, member):
                    for m in group.members.values():
                        m.assignment = b""
                        self._resolve_sync(m, SyncResult(e.code))
                    self._prepare_rebalance(group, "storing the assignment failed")
                return await waiter
            if not self._still_completing(group, generation_id, member):
                return await waiter
            group.transition_to(Stable, now_ms())
            for m in group.members.values():
                self._resolve_sync(m, self._sync_result(group, m))
        return await waiter

    def _still_completing(
        self, group: GroupMetadata, generation_id: int, leader: MemberMetadata
    ) -> bool:
        """Whether the group still awaits this generation's assignment after it was stored.
        A rebalance begun meanwhile (a join, a leave, an expiry) has answered the members
        REBALANCE_IN_PROGRESS and cleared their assignments; the leader is answered so too,
        and the group stays as that rebalance left it, as in Kafka."""
        if group.is_in(Completing) and group.generation_id == generation_id:
            return True
        self._resolve_sync(leader, SyncResult(ErrorCode.rebalance_in_progress))
        return False

    def _sync_result(self, group: GroupMetadata, member: MemberMetadata) -> SyncResult:
        return SyncResult(
            ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment
        )

    @staticmethod
    def _resolve_sync(member: MemberMetadata, result: SyncResult) -> None:
        if member.sync_waiter is not None and not member.sync_waiter.done():
            member.sync_waiter.set_result(result)
        member.sync_waiter = None

    # Heartbeat and LeaveGroup --------------------------------------------------------

    def heartbeat(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        error = self.coordinator_error(group_id)
        if error != ErrorCode.none:
            return error
        group = self.groups.get(group_id)
        if group is None or group.is_in(Empty) or member_id not in group.members:
            return ErrorCode.unknown_member_id
        member = group.members[member_id]
        if member.group_instance_id != group_instance_id:
            return ErrorCode.fenced_instance_id
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if not member.awaiting_join:
            self._schedule_session_expiry(group, member)
        return ErrorCode.rebalance_in_progress if group.is_in(Preparing) else ErrorCode.none

    def leave_group(
        self, group_id: str, leaving: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        error = self.coordinator_error(group_id)
        if error != ErrorCode.none:
            return error, []
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id, [
                (m, i, ErrorCode.unknown_member_id) for m, i in leaving
            ]
        results: list[tuple[str, str | None, ErrorCode]] = []
        for member_id, instance_id in leaving:
            if instance_id is not None:
                known_id = group.static_members.get(instance_id)
                if known_id is None:
                    results.append((member_id, instance_id, ErrorCode.unknown_member_id))
                    continue
                if member_id and member_id != known_id:
                    results.append((member_id, instance_id, ErrorCode.fenced_instance_id))
                    continue
                member_id = known_id
            if group.drop_pending(member_id):
                results.append((member_id, instance_id, ErrorCode.none))
                self._maybe_complete_join(group)
                continue
            member = group.members.get(member_id)
            if member is None:
                results.append((member_id, instance_id, ErrorCode.unknown_member_id))
                continue
            log.info("group %s: member %s left", group_id, member_id)
            self._remove_member_and_update_group(group, member)
            results.append((member_id, instance_id, ErrorCode.none))
        return ErrorCode.none, results

    # Membership changes --------------------------------------------------------------

    def _schedule_session_expiry(self, group: GroupMetadata, member: MemberMetadata) -> None:
        self._cancel_session_expiry(member)
        member.heartbeat_timer = asyncio.get_running_loop().call_later(
            member.session_timeout_ms / 1000, self._on_session_expired, group, member.member_id
        )

    @staticmethod
    def _cancel_session_expiry(member: MemberMetadata) -> None:
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
            member.heartbeat_timer = None

    def _on_session_expired(self, group: GroupMetadata, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is None or member.awaiting_join:
            return
        log.info("group %s: member %s session timed out", group.group_id, member_id)
        self._remove_member_and_update_group(group, member)

    def _expire_pending_member(self, group: GroupMetadata, member_id: str) -> None:
        if group.drop_pending(member_id):
            self._maybe_complete_join(group)

    def _cancel_member(self, member: MemberMetadata, error: ErrorCode) -> None:
        self._cancel_session_expiry(member)
        if member.join_waiter is not None and not member.join_waiter.done():
            member.join_waiter.set_result(JoinResult(error, member_id=member.member_id))
        self._resolve_sync(member, SyncResult(error))

    def _remove_member(
        self, group: GroupMetadata, member: MemberMetadata, error: ErrorCode
    ) -> None:
        self._cancel_member(member, error)
        del group.members[member.member_id]
        if member.group_instance_id is not None:
            group.static_members.pop(member.group_instance_id, None)
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), None)

    def _remove_member_and_update_group(self, group: GroupMetadata, member: MemberMetadata) -> None:
        self._remove_member(group, member, ErrorCode.unknown_member_id)
        if group.is_in(Stable, Completing):
            self._prepare_rebalance(group, f"member {member.member_id} left")
        self._maybe_complete_join(group)

    async def _persist_or_log(self, group: GroupMetadata) -> None:
        try:
            await self._persist(group)
        except KafkaError as e:
            log.warning(
                "group %s: storing generation %d failed: %s", group.group_id, group.generation_id, e
            )

    async def _persist(self, group: GroupMetadata) -> None:
        protocol = group.protocol_name
        await self.store.store_group(
            group.group_id,
            GroupValue(
                group.protocol_type or "",
                group.generation_id,
                protocol,
                group.leader_id,
                now_ms(),
                tuple(
                    MemberValue(
                        m.member_id,
                        m.group_instance_id,
                        m.client_id,
                        m.client_host,
                        m.rebalance_timeout_ms,
                        m.session_timeout_ms,
                        m.metadata_for(protocol) if protocol else b"",
                        m.assignment,
                    )
                    for m in group.members.values()
                ),
            ),
        )
