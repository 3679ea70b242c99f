"""Prometheus metrics of SEE, named ``mutualrl_see_*``.

A custom collector reads the exchange's own counters and asks the broker for
stream lengths, consumer-group lag and pending counts at scrape time, so a
scrape always shows the broker's present state and nothing has to be updated
on the hot path. Register it on the service's registry:
``registry.register(SeeCollector(exchange))``.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from typing_extensions import override

from mutualrl.see.exchange import ExperienceExchange, dead_letter_stream

# every label value a counter can take is exported from the start (at 0), so a dashboard or an
# alert over it has a series before the first event instead of "no data"
BACKPRESSURE_ACTIONS = ("blocked", "dropped", "timeout")
DEAD_LETTER_REASONS = ("decode_error", "unknown_schema_version", "invalid", "bad_signature", "wrong_kind",
                       "wrong_producer", "poison_pill",
                       # a learner's own rollouts it refuses (services/learner/own_experience.py)
                       "own_unknown_prompt", "own_malformed", "own_too_long", "own_bad_token", "own_bad_group",
                       "own_too_stale", "own_late", "own_conflict")


class SeeCollector(Collector):
    """Exports the exchange's counters (published, consumed, dead-lettered, backpressure) to Prometheus."""
    def __init__(self, exchange: ExperienceExchange):
        self.ex = exchange

    @override
    def collect(self) -> Iterator:
        yield from self._exchange_counters()
        yield from self._stream_gauges()

    def _exchange_counters(self) -> Iterator:
        """What this process's exchange counted: published, held back, consumed, duplicates, dead letters."""
        ex = self.ex
        ns = ex.namespace
        published = CounterMetricFamily("mutualrl_see_published", "Messages published, by kind.", labels=["namespace",
            "kind"])
        for kind, n in sorted(ex.published.items()):
            published.add_metric([ns, kind], n)
        yield published

        bp = CounterMetricFamily("mutualrl_see_backpressure", "Publishes held back by backpressure, by action "
                                 "(blocked, dropped, timeout).", labels=["namespace", "action"])
        for action in sorted(set(BACKPRESSURE_ACTIONS) | set(ex.backpressure_events)):
            bp.add_metric([ns, action], ex.backpressure_events.get(action, 0))
        yield bp

        delivered = CounterMetricFamily("mutualrl_see_consumed", "Messages acknowledged by a receiver, by kind.",
                                        labels=["namespace", "receiver", "kind"])
        dupes = CounterMetricFamily("mutualrl_see_duplicates", "Redeliveries skipped by receiver-side dedup.",
                                    labels=["namespace", "receiver"])
        dead = CounterMetricFamily("mutualrl_see_dead_lettered", "Messages a receiver moved to the dead-letter stream, "
                                   "by reason.", labels=["namespace", "receiver", "reason"])
        for sub in ex.subscriptions:
            for reason in DEAD_LETTER_REASONS:
                if f"dead_letter:{reason}" not in sub.counts:
                    dead.add_metric([ns, sub.group, reason], 0)
            for key, n in sorted(sub.counts.items()):
                if key == "duplicate":
                    dupes.add_metric([ns, sub.group], n)
                elif key.startswith("dead_letter:"):
                    dead.add_metric([ns, sub.group, key.split(":", 1)[1]], n)
                else:
                    delivered.add_metric([ns, sub.group, key], n)
        for reason, n in sorted(ex.control_dead_lettered.items()):  # junk found on control streams by last()
            dead.add_metric([ns, "control", reason], n)
        yield delivered
        yield dupes
        yield dead

    def _stream_gauges(self) -> Iterator:
        """What the broker holds now: stream lengths, group lag and pending entries, dead letters."""
        ex = self.ex
        ns = ex.namespace
        length = GaugeMetricFamily("mutualrl_see_stream_length", "Entries in each stream.", labels=["stream"])
        lag = GaugeMetricFamily("mutualrl_see_group_lag", "Entries not yet delivered to a consumer group.",
                                labels=["stream", "group"])
        pending = GaugeMetricFamily("mutualrl_see_pending", "Entries delivered to a group and not yet acknowledged.",
                                    labels=["stream", "group"])
        dl = GaugeMetricFamily("mutualrl_see_dead_letters", "Entries in the dead-letter stream.", labels=["namespace"])
        try:
            for stream in ex.broker.streams(ns + ":"):
                length.add_metric([stream], ex.broker.length(stream))
                for g in ex.broker.groups(stream):
                    if g.get("lag") is not None:
                        lag.add_metric([stream, g["name"]], float(g["lag"]))
                    pending.add_metric([stream, g["name"]], float(g["pending"]))
            dl.add_metric([ns], ex.broker.length(dead_letter_stream(ns)))
        except Exception:  # noqa: BLE001 - a scrape must not fail because the broker is briefly away
            up = GaugeMetricFamily("mutualrl_see_broker_up", "1 when the broker answered the last scrape.",
                                   labels=["namespace"])
            up.add_metric([ns], 0)
            yield up
            return
        up = GaugeMetricFamily("mutualrl_see_broker_up", "1 when the broker answered the last scrape.",
                               labels=["namespace"])
        up.add_metric([ns], 1)
        yield length
        yield lag
        yield pending
        yield dl
        yield up
