"""THL between the three real families' tokenizers, on 1,000 texts of the kinds a run carries.

SmolLM2-135M-Instruct (49,152-token byte-level BPE), Qwen2.5-Coder-0.5B-Instruct (151,936-token byte-level
BPE) and Gemma-3-270M (262,144-token SentencePiece with byte fallback): every ordered pair carries each text
from the source's ids to the target's, and the script counts unaligned bytes, round-trip failures, texts whose
carried text differs, and texts whose target ids are not the target's plain encoding.

The 1,000 texts: each model's own sampled completions on the task (``--samples`` a model, T = 1, in its
own prompt style), the chat-template renderings of SmolLM2 and the Qwen (as plain text: the template's
markers carried as characters), reasoning-gym questions of six datasets, non-ASCII text (accents, CJK,
Cyrillic, Arabic, emoji, typographic punctuation) and runs of whitespace (spaces, tabs, blank lines).

    .venv/bin/python tools/thl_families.py --out docs/results/real/thl-three-families.md
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

PRESETS = {"smollm2": "smollm2-135m-instruct", "qwen-coder": "qwen2.5-coder-0.5b-instruct", "gemma": "gemma-3-270m"}
NON_ASCII = ["Résultat : {c} ✓", "naïve café — {a}+{b}={c}", "日本語で {a} たす {b} は {c} です。", "Привет, {c}!",
             "الجواب هو {c}", "emoji 🤖➕🧮 = {c} 🎉", "“quoted” ‘single’ … {c} €", "Größe {a} µm × {b} ≈ {c}",
             "한국어 {c}", "Ελληνικά {a} + {b} = {c}", "ﬁ ligature and ß and Ǆ {c}", "zero\u200bwidth {c}"]
WHITESPACE = ["{a}  +   {b}    =     {c}", "\t{a}\t+\t{b}\n\n\n= {c}", "   leading {c}", "trailing {c}    ",
              "{a}\n\n\n\n{b}\r\n{c}", "line one\n  indented {c}\n\t\ttabbed", "{a} \u00a0{b}\u3000{c}",
              "    \n    \n{c}"]


def _texts(tokenizers: dict, samples: dict[str, list[str]], n: int, seed: int) -> list[tuple[str, str]]:
    import reasoning_gym as rg

    rng = random.Random(seed)
    out: list[tuple[str, str]] = [(f"sampled:{k}", t) for k, texts in samples.items() for t in texts]
    for name in ("smollm2", "qwen-coder"):
        tok = tokenizers[name]
        for q in rg.create_dataset("basic_arithmetic", seed=seed, size=40):
            rendered = tok.apply_chat_template([{"role": "user", "content": q["question"]}], add_generation_prompt=True,
                                               tokenize=False)
            out.append((f"chat-template:{name}", rendered + f"The answer is {q['answer']}."))
    for ds in ("basic_arithmetic", "countdown", "spell_backward", "leg_counting", "word_sorting", "products"):
        out += [("reasoning-gym", e["question"]) for e in rg.create_dataset(ds, seed=seed, size=50)]
    while len(out) < n:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        kind, pool = rng.choice([("non-ascii", NON_ASCII), ("whitespace", WHITESPACE)])
        out.append((kind, rng.choice(pool).format(a=a, b=b, c=a + b)))
    return out[:n]


def _sample(preset: str, n: int, max_new_tokens: int, seed: int) -> list[str]:
    """``n`` completions of the preset at T = 1 on basic_arithmetic, in its default prompt style."""
    import reasoning_gym as rg
    import torch
    from transformers import AutoModelForCausalLM

    from mutualrl.models import load_tokenizer
    from mutualrl.models.generation import sample
    from mutualrl.models.policy import COMPLETION_TEMPLATE, PromptStyle, encode_prompt
    from mutualrl.models.pretrained import get_model
    from mutualrl.runtime.evaluation import completion_text
    from mutualrl.tasks.answers import INSTRUCTIONS

    folder = get_model(preset)
    tok = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    style = PromptStyle(instruction=INSTRUCTIONS["last_number"], completion_template=COMPLETION_TEMPLATE)
    questions = [e["question"] for e in rg.create_dataset("basic_arithmetic", seed=seed + 7, size=n, min_terms=2,
                                                           max_terms=2, max_digits=2)]
    texts: list[str] = []
    gen = torch.Generator().manual_seed(seed)
    for i in range(0, n, 16):
        prompts = [encode_prompt(tok, q, style) for q in questions[i : i + 16]]
        outs = sample(model, prompts, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                      max_new_tokens=max_new_tokens, temperature=1.0, generator=gen)
        texts += [completion_text(tok, o, style) for o in outs]
    del model
    return texts


def carry(src, dst, texts: list[tuple[str, str]]) -> dict:
    """Every text from ``src``'s ids to ``dst``: the counts of anything not carried exactly."""
    from mutualrl.thl import convert

    row = {"texts": len(texts), "unaligned_bytes": 0, "texts_unaligned": 0, "roundtrip_failures": 0,
           "text_changed": 0, "ids_not_plain": 0, "examples": []}
    for kind, text in texts:
        ids = src(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        conv = convert(src, dst, source_ids=ids, source_logprobs=[-0.5] * len(ids))
        r = conv.residual
        lost = round(r.unaligned_fraction * len(conv.text.encode()))
        plain = dst(conv.text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        bad = [lost > 0, not r.roundtrip_ok, conv.text != text, conv.target_ids != plain]
        row["unaligned_bytes"] += lost
        row["texts_unaligned"] += bad[0]
        row["roundtrip_failures"] += bad[1]
        row["text_changed"] += bad[2]
        row["ids_not_plain"] += bad[3]
        if any(bad) and len(row["examples"]) < 3:
            row["examples"].append({"kind": kind, "text": text[:120], "carried": conv.text[:120], "lost_bytes": lost})
    return row


def main() -> None:
    """Sample, build the texts, carry them between every ordered pair, write the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=64, help="Sampled completions per model.")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="Markdown report (and .json beside it).")
    a = ap.parse_args()

    from mutualrl.models import load_tokenizer
    from mutualrl.models.pretrained import get_model

    t0 = time.monotonic()
    tokenizers = {k: load_tokenizer(get_model(v)) for k, v in PRESETS.items()}
    samples = {k: _sample(v, a.samples, a.max_new_tokens, a.seed) for k, v in PRESETS.items()}
    texts = _texts(tokenizers, samples, a.n, a.seed)
    kinds: dict[str, int] = {}
    for kind, _ in texts:
        kinds[kind.split(":")[0]] = kinds.get(kind.split(":")[0], 0) + 1
    rows = {f"{s}->{d}": carry(tokenizers[s], tokenizers[d], texts) for s in PRESETS for d in PRESETS if s != d}
    result = {"texts": len(texts), "kinds": kinds, "pairs": rows, "seconds": round(time.monotonic() - t0, 1),
              "sample_examples": {k: v[:3] for k, v in samples.items()}}
    lines = [f"{len(texts)} texts: " + ", ".join(f"{n} {k}" for k, n in kinds.items()), "",
             "| source -> target | unaligned bytes | texts with unaligned bytes | round-trip failures | text changed | "
             "target ids not the plain encoding |", "|---|---|---|---|---|---|"]
    for pair, r in rows.items():
        lines.append(f"| {pair} | {r['unaligned_bytes']} | {r['texts_unaligned']} | {r['roundtrip_failures']} | "
                     f"{r['text_changed']} | {r['ids_not_plain']} |")
    report = "\n".join(lines)
    print(report)
    for pair, r in rows.items():
        for ex in r["examples"]:
            print(f"  {pair}: {json.dumps(ex, ensure_ascii=False)}")
    if a.out:
        a.out.write_text(report + "\n")
        a.out.with_suffix(".json").write_text(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
