"""`CleanerMetrics`: the log cleaner's gauges under Kafka's names (`kafka.log:type=LogCleaner`
and `LogCleanerManager`; Prometheus takes no `-`, so `max-dirty-percent` is
`max_dirty_percent`), computed when Prometheus scrapes.

Per pass they describe the last pass of each cleaner thread, as Kafka's do:
`max_buffer_utilization_percent` (offset map fill), `cleaner_recopy_percent` (bytes
written over bytes read, averaged over threads) and `max_clean_time_secs`.
`max_dirty_percent` is the dirtiest compacted log's share of cleanable bytes when the
cleaner last chose; `uncleanable_partitions_count` counts, per log dir, the logs a
pass failed on; `DeadThreadCount` the cleaner threads that stopped.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tierbroker.storage.log import now_ms
from tierbroker.storage.log_cleaner import LogCleaner


class CleanerMetrics(Collector):
    def __init__(self, cleaner: LogCleaner, registry: CollectorRegistry) -> None:
        self.cleaner = cleaner
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        cleaner = self.cleaner
        stats = [s for s in cleaner.last_stats if s is not None]
        threads = len(cleaner.last_stats)
        yield GaugeMetricFamily(
            "max_buffer_utilization_percent",
            "The fullest offset map of the cleaner threads' last passes",
            value=100 * max((s.map_utilization for s in stats), default=0.0),
        )
        yield GaugeMetricFamily(
            "cleaner_recopy_percent",
            "Bytes written over bytes read by the last passes, averaged over cleaner threads",
            value=100 * sum(s.bytes_written / max(s.bytes_read, 1) for s in stats) / threads,
        )
        yield GaugeMetricFamily(
            "max_clean_time_secs",
            "The longest of the cleaner threads' last passes",
            value=max((s.elapsed_s for s in stats), default=0.0),
        )
        yield GaugeMetricFamily(
            "max_dirty_percent",
            "The dirtiest compacted log's cleanable share when the cleaner last chose",
            value=100 * cleaner.manager.max_dirty_ratio,
        )
        yield GaugeMetricFamily(
            "time_since_last_run_ms",
            "Since a cleaner thread last looked for a log to clean",
            value=now_ms() - cleaner.last_run_ms,
        )
        uncleanable = GaugeMetricFamily(
            "uncleanable_partitions_count",
            "Logs a cleaning pass failed on, skipped until the broker restarts",
            labels=["logDirectory"],
        )
        for log_dir in cleaner.log_manager.log_dirs:
            count = len(cleaner.manager.uncleanable.get(log_dir, ()))
            uncleanable.add_metric([str(log_dir)], count)
        yield uncleanable
        yield GaugeMetricFamily(
            "DeadThreadCount", "Cleaner threads that stopped", value=cleaner.dead_threads
        )
