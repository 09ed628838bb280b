"""`SampledRate`: a value per second over sampled windows, as Kafka's quota sensors measure it.

Kafka's `Rate` over a `WindowedSum`: `quota.window.num` samples (11), each
`quota.window.size.seconds` long (1 s). A value recorded goes into the current sample,
or a new one once the current is a window old (the oldest of `samples + 1` is reused); a
sample whose last value is older than all the windows together is reset. The rate is the
sum of the samples over the time since the oldest one started, counted as at least
`samples - 1` whole windows, so a client's first burst is not measured over a few
milliseconds. Times are monotonic milliseconds given by the caller. Not thread-safe: one
event loop records and measures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QuotaWindow:
    """`quota.window.num` samples of `quota.window.size.seconds` each, Kafka's defaults."""

    samples: int = 11
    window_ms: int = 1000


class _Sample:
    __slots__ = ("last_event_ms", "start_ms", "value")

    def __init__(self, now_ms: int) -> None:
        self.start_ms = now_ms
        self.last_event_ms = now_ms
        self.value = 0.0

    def reset(self, now_ms: int) -> None:
        self.start_ms = self.last_event_ms = now_ms
        self.value = 0.0


class SampledRate:
    def __init__(self, window: QuotaWindow) -> None:
        self.window = window
        self._samples: list[_Sample] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        """Add `value` (negative to take back what a throttled fetch did not send)."""
        sample = self._current_sample(now_ms)
        if now_ms - sample.start_ms >= self.window.window_ms:
            sample = self._advance(now_ms)
        sample.value += value
        sample.last_event_ms = now_ms

    def measure(self, now_ms: int) -> float:
        """The rate per second at `now_ms`."""
        window_ms = self.window_size_ms(now_ms)  # purges obsolete samples first
        return sum(s.value for s in self._samples) * 1000 / window_ms

    def window_size_ms(self, now_ms: int) -> int:
        """The time the rate is measured over: since the oldest sample, at least
        `samples - 1` windows, at least 1 ms (Kafka's `Rate.windowSize`)."""
        self._purge_obsolete(now_ms)
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        elapsed_ms = now_ms - min(s.start_ms for s in self._samples)
        full_windows = elapsed_ms // self.window.window_ms
        min_full_windows = self.window.samples - 1
        if full_windows < min_full_windows:
            elapsed_ms += (min_full_windows - full_windows) * self.window.window_ms
        return max(elapsed_ms, 1)

    def idle_since_ms(self) -> int:
        """When the last value was recorded (for dropping rates no one updates)."""
        return max((s.last_event_ms for s in self._samples), default=0)

    def _current_sample(self, now_ms: int) -> _Sample:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        return self._samples[self._current]

    def _advance(self, now_ms: int) -> _Sample:
        # One sample more than the windows: the oldest may overlap the measured time.
        self._current = (self._current + 1) % (self.window.samples + 1)
        if self._current >= len(self._samples):
            self._samples.append(_Sample(now_ms))
        else:
            self._samples[self._current].reset(now_ms)
        return self._samples[self._current]

    def _purge_obsolete(self, now_ms: int) -> None:
        expire_ms = self.window.samples * self.window.window_ms
        for sample in self._samples:
            if now_ms - sample.last_event_ms >= expire_ms:
                sample.reset(now_ms)


def throttle_time_ms(rate: float, bound: float, window_ms: int) -> int:
    """How long a client measured at `rate` must send nothing for its rate over the
    window to fall back to `bound`: O * W / (W + X) = T gives X = (O - T) / T * W
    (Kafka's `QuotaUtils.throttleTime`); 0 within the bound."""
    if rate <= bound:
        return 0
    return int((rate - bound) / bound * window_ms + 0.5)  # Java's Math.round: half up
