"""The run's metrics records go to ``metrics.jsonl`` first (the source of truth, written and flushed
before anything else) and then to each policy's trackers."""

from __future__ import annotations

from typing import Protocol

from mutualrl.tracking.tracker import Tracker


class RecordWriter(Protocol):
    """``metrics.jsonl``'s writer (:class:`mutualrl.runtime.outputs.MetricsWriter`)."""

    def write(self, record: dict) -> None:
        """Append one record durably."""


class RecordSink:
    """Writes a record, then hands it to its policy's tracker (a policy without one is only written)."""

    def __init__(self, writer: RecordWriter, trackers: dict[str, Tracker]):
        self.writer = writer
        self.trackers = trackers

    def write(self, record: dict) -> None:
        """The record into ``metrics.jsonl``, then to the trackers (which only queue it)."""
        self.writer.write(record)
        tracker = self.trackers.get(record.get("policy", ""))
        if tracker is not None:
            tracker.log(record)

    def finish(self, summaries: dict[str, dict]) -> dict[str, dict]:
        """Each policy's final numbers to its trackers, which then close; per policy, what each backend
        sent and dropped (for ``summary.json``)."""
        return {name: t.finish(summaries.get(name, {})) for name, t in self.trackers.items()}
