"""`ReplicaState`: what a partition's leader knows of one follower, from its fetches.

Only that follower's fetches change it (Kafka's `Replica.updateFetchStateOrThrow`). A
follower is caught up while its log end offset equals the leader's, or while it last
reached the leader's log end offset (as it was at its previous fetch) less than
`replica.lag.time.max.ms` ago: a follower always one fetch behind a steady producer
stays in the ISR. Not shared between tasks: the event loop owns it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ReplicaState:
    broker_id: int
    log_end_offset: int = -1  # unknown until it fetches
    log_start_offset: int = -1
    last_fetch_leader_log_end_offset: int = -1
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0
    broker_epoch: int = -1
    last_sent_high_watermark: int = -1  # what the last answer to its fetch told it

    def update_fetch_state(
        self,
        fetch_offset: int,
        log_start_offset: int,
        fetch_time_ms: int,
        leader_end_offset: int,
        broker_epoch: int,
    ) -> None:
        if fetch_offset >= leader_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, fetch_time_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_leader_log_end_offset = leader_end_offset
        self.last_fetch_time_ms = fetch_time_ms
        self.broker_epoch = broker_epoch

    def is_caught_up(self, leader_end_offset: int, now_ms: int, max_lag_ms: int) -> bool:
        return (
            self.log_end_offset == leader_end_offset
            or now_ms - self.last_caught_up_time_ms <= max_lag_ms
        )

    def reset(self, now_ms: int, in_isr: bool) -> None:
        """A new leadership: what it knew of the follower no longer holds (Kafka's makeLeader
        resets followers; ISR members count as caught up now)."""
        self.log_end_offset = -1
        self.log_start_offset = -1
        self.last_fetch_leader_log_end_offset = -1
        self.last_fetch_time_ms = 0
        self.last_caught_up_time_ms = now_ms if in_isr else 0
        self.last_sent_high_watermark = -1
