"""Envelope encoding: build, sign (HMAC-SHA256), serialize, and the reverse with validation."""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid

from google.protobuf.message import DecodeError, Message

from mutualrl.v1 import experience_pb2 as pb

SCHEMA_VERSION = pb.SCHEMA_VERSION_1
KNOWN_SCHEMA_VERSIONS = frozenset({pb.SCHEMA_VERSION_1})

# payload field name in the Envelope oneof -> message class
PAYLOAD_KINDS: dict[str, type[Message]] = {
    "rollout": pb.Rollout,
    "advantage_stats": pb.AdvantageStats,
    "verified_success": pb.VerifiedSuccess,
    "weights_published": pb.WeightsPublished,
    "heartbeat": pb.Heartbeat,
}
_KIND_OF = {cls.DESCRIPTOR.full_name: kind for kind, cls in PAYLOAD_KINDS.items()}


class CodecError(ValueError):
    """A message that must go to the dead-letter stream; ``reason`` is a short code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def kind_of(payload: Message) -> str:
    try:
        return _KIND_OF[payload.DESCRIPTOR.full_name]
    except KeyError:
        raise TypeError(f"{type(payload).__name__} is not an experience payload; valid: {', '.join(PAYLOAD_KINDS)}") from None


class EnvelopeCodec:
    """Wraps payloads in envelopes and checks them on the way back.

    The signature is an HMAC-SHA256 over the deterministic serialization of the
    envelope with ``signature`` cleared; when a key is configured every message
    must carry a valid one, so a peer without the key cannot inject experience.
    """

    def __init__(self, hmac_key: bytes | None = None):
        self.hmac_key = hmac_key

    def _sign(self, env: pb.Envelope) -> bytes:
        assert self.hmac_key is not None
        unsigned = pb.Envelope()
        unsigned.CopyFrom(env)
        unsigned.ClearField("signature")
        return hmac.new(self.hmac_key, unsigned.SerializeToString(deterministic=True), hashlib.sha256).digest()

    def wrap(self, payload: Message, producer: str, weights_version: int = 0, message_id: str | None = None) -> pb.Envelope:
        env = pb.Envelope(
            schema_version=SCHEMA_VERSION,
            message_id=message_id or uuid.uuid4().hex,
            producer=producer,
            weights_version=weights_version,
            created_unix_nanos=time.time_ns(),
        )
        getattr(env, kind_of(payload)).CopyFrom(payload)
        if self.hmac_key:
            env.signature = self._sign(env)
        return env

    def encode(self, env: pb.Envelope) -> bytes:
        return env.SerializeToString(deterministic=True)

    def decode(self, data: bytes) -> pb.Envelope:
        env = pb.Envelope()
        try:
            env.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise CodecError("decode_error", f"not an Envelope ({e})") from None
        if env.schema_version not in KNOWN_SCHEMA_VERSIONS:
            raise CodecError("unknown_schema_version", f"schema_version={env.schema_version}")
        if not env.message_id:
            raise CodecError("invalid", "missing message_id")
        if env.WhichOneof("payload") is None:
            raise CodecError("invalid", "no payload")
        if self.hmac_key:
            if not env.signature:
                raise CodecError("bad_signature", "message is unsigned")
            if not hmac.compare_digest(env.signature, self._sign(env)):
                raise CodecError("bad_signature", "HMAC does not match")
        return env
