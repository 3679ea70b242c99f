"""THL throughput: converting completions between two tokenizers vs the receiver's plain batch encode.

Converts 4,096 completions of about 200 tokens (source ids + per-token
log-probs -> target ids + transported log-probs + residual) and divides the
throughput by that of ``target_tok(texts)`` on the same texts in the same
process. Issue goal: ratio >= 0.5 (THL costs at most twice a plain encode).

    .venv/bin/python benchmarks/bench_thl.py [--n 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mutualrl.models import build_tokenizer  # noqa: E402
from mutualrl.models.production import qwen25_tokenizer  # noqa: E402
from mutualrl.thl import convert_batch  # noqa: E402

WORDS = (
    "the model samples a group of answers and the verifier checks each one ; if 12 + 34 = 46 then "
    "reward is 1 else 0 . policies share verified successes across tokenizers , café naïve 世界 🙂"
).split()


def make_texts(n: int, tokens: int, tok, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words: list[str] = []
        while len(words) < tokens * 0.8:
            words.append(rng.choice(WORDS) if rng.random() < 0.85 else str(rng.randint(0, 99999)))
        texts.append(" ".join(words))
    return texts


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    qwen = qwen25_tokenizer()
    corpus = make_texts(2000, 60, None, seed=1)
    bpe = build_tokenizer("bpe", corpus, 2000)
    uni = build_tokenizer("unigram", corpus, 800)
    texts = make_texts(args.n, args.tokens, qwen)
    print(f"{args.n} completions, ~{args.tokens} words each; best of {args.repeats}")
    print("THL s: the receiver checks canonicality itself; +flag: the producer sent it (Rollout.canonical), the "
          "learner's case")
    print(f"{'source -> target':28s} {'src tok/compl':>13s} {'encode s':>9s} {'THL s':>8s} {'ratio':>6s} "
          f"{'+flag s':>8s} {'ratio':>6s}  residual (mean u, roundtrip ok)")
    for (sname, s), (tname, t) in [(("qwen2.5", qwen), ("bpe-2k", bpe)), (("bpe-2k", bpe), ("qwen2.5", qwen)),
                                   (("qwen2.5", qwen), ("unigram-800", uni))]:
        ids = [row + [s.eos_token_id] for row in s(texts, add_special_tokens=False)["input_ids"]]
        lps = [[-0.5] * len(row) for row in ids]
        enc_s = best_of(lambda: t(texts, add_special_tokens=False), args.repeats)
        convert_batch(s, t, ids[:8], lps[:8])  # build the per-vocabulary tables once, outside the timing
        thl_s = best_of(lambda: convert_batch(s, t, ids, lps), args.repeats)
        flags = [True] * len(ids)
        flag_s = best_of(lambda: convert_batch(s, t, ids, lps, source_canonical=flags), args.repeats)
        conv = convert_batch(s, t, ids, lps)
        u = statistics.fmean(c.residual.unaligned_fraction for c in conv)
        rt = sum(c.residual.roundtrip_ok for c in conv) / len(conv)
        mean_len = statistics.fmean(len(r) for r in ids)
        print(f"{sname + ' -> ' + tname:28s} {mean_len:13.0f} {enc_s:9.3f} {thl_s:8.3f} {enc_s / thl_s:6.2f} "
              f"{flag_s:8.3f} {enc_s / flag_s:6.2f}  u={u:.4f}, roundtrip={rt:.1%}")


if __name__ == "__main__":
    main()
