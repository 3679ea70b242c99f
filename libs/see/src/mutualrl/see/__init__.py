"""SEE — the Shared Experience Exchange (docs/architecture.md, "Messages").

Typed protobuf messages in an :class:`~mutualrl.v1.experience_pb2.Envelope`,
carried on streams (one per experience type and producer) with one consumer
group per receiving policy, at-least-once delivery with idempotent receivers,
bounded retention and a dead-letter stream. ``InProcessBroker`` is the embedded
default; ``RedisBroker`` (Redis Streams) is the durable backend the services share.
Both implement the same :class:`Broker` contract, checked by one test suite.
"""

from mutualrl.see.broker import Broker, Entry
from mutualrl.see.codec import PAYLOAD_KINDS, SCHEMA_VERSION, CodecError, EnvelopeCodec
from mutualrl.see.exchange import (
    Backpressure,
    BackpressureTimeout,
    ExperienceExchange,
    Received,
    Subscription,
    dead_letter_stream,
    stream_name,
)
from mutualrl.see.inprocess import InProcessBroker
from mutualrl.see.metrics import SeeCollector
from mutualrl.see.redis_broker import RedisBroker, RedisOptions

__all__ = [
    "Broker",
    "Entry",
    "InProcessBroker",
    "CodecError",
    "EnvelopeCodec",
    "PAYLOAD_KINDS",
    "SCHEMA_VERSION",
    "Backpressure",
    "BackpressureTimeout",
    "ExperienceExchange",
    "RedisBroker",
    "RedisOptions",
    "SeeCollector",
    "dead_letter_stream",
    "Received",
    "Subscription",
    "stream_name",
]
