"""The follower truncation rule against a model of replicated logs (KIP-101, KIP-279).

Hypothesis plays a partition's history on three replicas: elections of any replica (clean
or not) with a new leader epoch, appends by the leader, and followers fetching from it as
tierbroker's fetchers do: the leader answers a diverging epoch from its epoch cache, the
follower truncates with `truncation_for` and fetches again. After any history, a follower
that fetches until it has caught up holds exactly the leader's log, and it never cut what
both logs agreed on.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tierbroker.broker.replication.truncation import truncation_for
from tierbroker.storage.leader_epoch import LeaderEpochCache


class Replica:
    """A log as the leader epoch of each offset, and its epoch cache."""

    def __init__(self, path: Path) -> None:
        self.epochs: list[int] = []
        self.cache = LeaderEpochCache(path)

    @property
    def end(self) -> int:
        return len(self.epochs)

    def truncate(self, offset: int) -> None:
        del self.epochs[offset:]
        self.cache.truncate_from_end(offset)

    def append(self, epochs: list[int]) -> None:
        for epoch in epochs:
            self.cache.assign(epoch, len(self.epochs))
            self.epochs.append(epoch)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def fetch_until_caught_up(leader: Replica, follower: Replica) -> None:
    agreed = common_prefix(leader.epochs, follower.epochs)
    for _ in range(100):
        # As the fetcher sends it: the latest epoch of the follower's cache, which may name
        # an epoch it led without writing (its log is not the judge, its cache is).
        last_epoch = follower.cache.latest_epoch
        if last_epoch >= 0:
            epoch, end = leader.cache.end_offset_for(last_epoch, leader.end)
            if epoch < 0 or end < 0 or end < follower.end or epoch < last_epoch:
                cut = truncation_for(
                    epoch,
                    end,
                    lambda e: follower.cache.end_offset_for(e, follower.end),
                    follower.end,
                )
                assert cut.offset >= agreed, "truncated what both logs agreed on"
                follower.truncate(cut.offset)
                continue
        follower.append(leader.epochs[follower.end :])
        return
    raise AssertionError("the follower never caught up")


# A history: (elect replica i), (append n records), (replica i fetches once).
events = st.lists(
    st.one_of(
        st.tuples(st.just("elect"), st.integers(0, 2)),
        st.tuples(st.just("append"), st.integers(1, 3)),
        st.tuples(st.just("fetch"), st.integers(0, 2)),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_a_follower_that_catches_up_holds_its_leaders_log(history: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        replicas = [Replica(Path(tmp) / f"r{i}") for i in range(3)]
        leader, epoch = 0, 0
        replicas[0].cache.assign(0, 0)
        for kind, value in history:
            if kind == "elect" and value != leader:
                epoch += 1
                leader = value
                replicas[leader].cache.assign(epoch, replicas[leader].end)
            elif kind == "append":
                replicas[leader].append([epoch] * value)
            elif kind == "fetch" and value != leader:
                fetch_until_caught_up(replicas[leader], replicas[value])
        for i, follower in enumerate(replicas):
            if i != leader:
                fetch_until_caught_up(replicas[leader], follower)
                assert follower.epochs == replicas[leader].epochs
