"""The envelope codec's publishing fast path is byte-exact and its signature is checked."""

import pytest

from mutualrl.see.codec import CodecError, EnvelopeCodec
from mutualrl.v1 import experience_pb2 as pb


def _payload():
    return pb.Rollout(prompt_id="p", completion_text="é" * 300, token_ids=[1, 2, 300], logprobs=[-0.5, -0.25, -1.0],
                      reward=1.0)


def test_wrap_encoded_is_the_deterministic_serialisation_plus_signature():
    c = EnvelopeCodec(b"key")
    mid, data = c.wrap_encoded(_payload(), "a", 7)
    env = pb.Envelope()
    env.ParseFromString(data)
    assert env.rollout == _payload() and env.message_id == mid and env.weights_version == 7 and len(env.signature) == 32
    env.ClearField("signature")
    assert data[:-34] == env.SerializeToString(deterministic=True)
    assert c.decode(data).message_id == mid


def test_signature_verifies_in_either_field_order_and_catches_tampering():
    c = EnvelopeCodec(b"key")
    _, data = c.wrap_encoded(_payload(), "a")
    env = c.decode(data)
    # signature re-serialised in place
    assert c.decode(env.SerializeToString(deterministic=True)).message_id == env.message_id
    tampered = bytearray(data)
    tampered[40] ^= 0x01
    with pytest.raises(CodecError) as e:
        c.decode(bytes(tampered))
    assert e.value.reason in ("bad_signature", "decode_error")
    with pytest.raises(CodecError, match="HMAC|unsigned") as e:
        EnvelopeCodec(b"other key").decode(data)
    assert e.value.reason == "bad_signature"
    unsigned = EnvelopeCodec(None).wrap_encoded(_payload(), "a")[1]
    with pytest.raises(CodecError, match="unsigned"):
        c.decode(unsigned)
