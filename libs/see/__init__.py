"""SEE — the Shared Experience Exchange (design.md).

Typed protobuf messages in an :class:`~mutualrl.v1.experience_pb2.Envelope`,
carried on streams (one per experience type and producer) with one consumer
group per receiving policy, at-least-once delivery with idempotent receivers,
bounded retention and a dead-letter stream. ``InProcessBroker`` is the embedded
default; a Redis Streams backend implements the same :class:`Broker` contract.
"""

from mutualrl.see.broker import Broker, Entry
from mutualrl.see.inprocess import InProcessBroker
from mutualrl.see.codec import CodecError, EnvelopeCodec, PAYLOAD_KINDS, SCHEMA_VERSION
from mutualrl.see.exchange import ExperienceExchange, Received, Subscription, stream_name

__all__ = [
    "Broker",
    "Entry",
    "InProcessBroker",
    "CodecError",
    "EnvelopeCodec",
    "PAYLOAD_KINDS",
    "SCHEMA_VERSION",
    "ExperienceExchange",
    "Received",
    "Subscription",
    "stream_name",
]
