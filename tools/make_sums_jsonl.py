"""Write a JSONL task of three-term sums whose partial sums stay within a bound (issue #44's cold-start probes).

Why: a peer's worked success on ``a + b + c``, its answer masked, leaves the receiver one step, ``(a + b) + c``.
With ``a + b <= --max-partial`` and ``c <= --max-term`` that step is exactly a two-term sum of pair A's setting
(terms of 1–2 digits), which a receiver can be probed on alone. The question reads as reasoning-gym's
``basic_arithmetic`` writes it (``Calculate 6 + 6 + 7.``), so the policies see the same text as in the
reasoning-gym probes. ``--last-step`` writes each problem's last step instead, ``Calculate (a + b) + c`` as a
two-term sum, for probing the receiver on the step alone.

    .venv/bin/python tools/make_sums_jsonl.py examples/real/sharing/data/sum3-partial99.jsonl
    .venv/bin/python tools/make_sums_jsonl.py examples/real/sharing/data/sum3-partial99-last-step.jsonl --last-step
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def three_term_sums(n: int, max_partial: int, max_term: int, seed: int,
                    last_step: bool = False) -> list[dict[str, str]]:
    """``n`` distinct problems ``a + b + c`` with ``1 <= a, b``, ``a + b <= max_partial`` and ``1 <= c <= max_term``;
    ``(a, b)`` uniform over the pairs allowed, ``c`` uniform. ``last_step``: each as ``(a + b) + c`` instead."""
    pairs = [(a, b) for a in range(1, max_partial) for b in range(1, max_partial - a + 1)]
    if n > len(pairs) * max_term:
        raise ValueError(f"only {len(pairs) * max_term} distinct problems exist; asked for {n}")
    rng = random.Random(seed)
    seen: set[tuple[int, int, int]] = set()
    rows: list[dict[str, str]] = []
    while len(rows) < n:
        a, b = rng.choice(pairs)
        c = rng.randint(1, max_term)
        if (a, b, c) in seen:
            continue
        seen.add((a, b, c))
        question = f"Calculate {a + b} + {c}." if last_step else f"Calculate {a} + {b} + {c}."
        rows.append({"prompt": question, "answer": str(a + b + c)})
    return rows


def main() -> None:
    """Write the file the command line names."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--max-partial", type=int, default=99, help="the largest a + b")
    parser.add_argument("--max-term", type=int, default=99, help="the largest c")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--last-step", action="store_true", help="write each problem's last step, (a + b) + c")
    args = parser.parse_args()
    rows = three_term_sums(args.n, args.max_partial, args.max_term, args.seed, args.last_step)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} problems to {args.out}")


if __name__ == "__main__":
    main()
