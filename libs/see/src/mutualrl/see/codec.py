"""Envelope encoding: build, sign (HMAC-SHA256), serialize, and the reverse with validation."""

from __future__ import annotations

import hashlib
import hmac
import os
import time

from google.protobuf.message import DecodeError, Message

from mutualrl.see.identity import Keyring, owner_of
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
    "sample_request": pb.SampleRequest,
    "sample_result": pb.SampleResult,
}
_KIND_OF = {cls.DESCRIPTOR.full_name: kind for kind, cls in PAYLOAD_KINDS.items()}


class CodecError(ValueError):
    """A message that must go to the dead-letter stream; ``reason`` is a short code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def kind_of(payload: Message) -> str:
    """A payload's SEE kind (``rollout``, ``heartbeat``, ...); a TypeError for a message that is not one."""
    try:
        return _KIND_OF[payload.DESCRIPTOR.full_name]
    except KeyError:
        raise TypeError(f"{type(payload).__name__} is not an experience payload; valid: "
                        f"{', '.join(PAYLOAD_KINDS)}") from None


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_PAYLOAD_TAGS = {f.name: _varint(f.number << 3 | 2) for f in pb.Envelope.DESCRIPTOR.oneofs_by_name["payload"].fields}


def _field_tag(kind: str) -> bytes:
    return _PAYLOAD_TAGS[kind]


_SIG_TAG = b"\x32\x20"
"""Envelope.signature (field 6, length-delimited) holding 32 bytes: tag and length prefix."""


class EnvelopeCodec:
    """Wraps payloads in envelopes and checks them on the way back.

    The signature is an HMAC-SHA256 over the deterministic serialization of the
    envelope with ``signature`` cleared, keyed by the *owning service's* key
    (:mod:`mutualrl.see.identity`): a rollout is signed with its rollout service's
    key, a weights announcement with its learner's. When signing is on every message
    must carry a valid signature under the key of the service its kind and producer
    name — so a message claiming another producer needs that producer's key, and a
    receiver without a service's key accepts nothing from it. (Both forms verify: the
    signature field appended to the signed bytes, which is what publishers write, or
    anywhere in a re-serialised envelope.)

    ``keys``: a :class:`Keyring`, or one run key (bytes) every service key derives from.
    """

    def __init__(self, keys: Keyring | bytes | None = None):
        self.keyring = Keyring(run_key=keys) if isinstance(keys, bytes) else keys

    @property
    def signing(self) -> bool:
        """Whether envelopes are signed and verified (a keyring is set)."""
        return self.keyring is not None

    def _signing_key(self, kind: str, producer: str) -> bytes | None:
        if self.keyring is None:
            return None
        key = self.keyring.key_for(kind, producer)
        if key is None:
            raise KeyError(f"no signing key for {owner_of(kind, producer)} (this service holds "
                           f"{', '.join(self.keyring.keys) or 'none'})")
        return key

    @staticmethod
    def _sign(env: pb.Envelope, key: bytes) -> bytes:
        """HMAC over the envelope serialised with ``signature`` empty (the field is cleared
        for the computation and restored, instead of copying the whole message)."""
        sig = env.signature
        env.ClearField("signature")
        try:
            return hmac.new(key, env.SerializeToString(deterministic=True), hashlib.sha256).digest()
        finally:
            if sig:
                env.signature = sig

    @staticmethod
    def _header(producer: str, weights_version: int, message_id: str | None) -> pb.Envelope:
        """An envelope with every field but the payload and the signature."""
        return pb.Envelope(
            schema_version=SCHEMA_VERSION, message_id=message_id or os.urandom(16).hex(), producer=producer,
            weights_version=weights_version, created_unix_nanos=time.time_ns(),
        )

    def wrap(self, payload: Message, producer: str, weights_version: int = 0,
             message_id: str | None = None) -> pb.Envelope:
        """An Envelope around ``payload``: header, producer, weights version and, when signing, its signature."""
        env = self._header(producer, weights_version, message_id)
        kind = kind_of(payload)
        getattr(env, kind).CopyFrom(payload)
        key = self._signing_key(kind, producer)
        if key:
            env.signature = self._sign(env, key)
        return env

    def encode(self, env: pb.Envelope) -> bytes:
        """An envelope's bytes (deterministic serialisation, so signatures are stable)."""
        return env.SerializeToString(deterministic=True)

    def wrap_encoded(self, payload: Message, producer: str, weights_version: int = 0,
                     message_id: str | None = None) -> tuple[str, bytes]:
        """``(message_id, bytes)`` for publishing, built without copying the payload: the
        envelope's header fields (1–5) serialised, then the payload as its length-delimited
        field — byte for byte the deterministic serialisation of the whole envelope, since
        fields are written in number order. The HMAC covers those bytes and is appended as
        the signature field (field order is free in protobuf; :meth:`decode` verifies both
        this and a re-serialised form)."""
        env = self._header(producer, weights_version, message_id)
        mid, head = env.message_id, env.SerializeToString(deterministic=True)
        kind = kind_of(payload)
        body = payload.SerializeToString(deterministic=True)
        data = head + _field_tag(kind) + _varint(len(body)) + body
        key = self._signing_key(kind, producer)
        if key:
            data += _SIG_TAG + hmac.digest(key, data, "sha256")
        return mid, data

    def decode(self, data: bytes) -> pb.Envelope:
        """Parse and check an envelope (schema version, signature); a ``CodecError`` names what is wrong."""
        env = pb.Envelope()
        try:
            env.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise CodecError("decode_error", f"not an Envelope ({e})") from None
        if env.schema_version not in KNOWN_SCHEMA_VERSIONS:
            raise CodecError("unknown_schema_version", f"schema_version={env.schema_version}")
        if not env.message_id:
            raise CodecError("invalid", "missing message_id")
        kind = env.WhichOneof("payload")
        if kind is None:
            raise CodecError("invalid", "no payload")
        if self.keyring is not None:
            if not env.signature:
                raise CodecError("bad_signature", "message is unsigned")
            key = self.keyring.key_for(kind, env.producer)
            if key is None:
                raise CodecError("bad_signature",
                                 f"no key for {owner_of(kind, env.producer)!r}: this receiver does not read from it")
            if data.endswith(_SIG_TAG + env.signature) and len(env.signature) == 32:
                # signed over the bytes before the appended signature (wrap_encoded)
                expected = hmac.digest(key, data[: -len(_SIG_TAG) - 32], "sha256")
                if hmac.compare_digest(env.signature, expected):
                    return env
            if not hmac.compare_digest(env.signature, self._sign(env, key)):
                raise CodecError("bad_signature", f"HMAC does not match {owner_of(kind, env.producer)!r}'s key")
        return env
