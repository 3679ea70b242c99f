"""Pool the results of compares that ran the same entries on disjoint seeds, from their results.json alone.

    .venv/bin/python tools/pool_results.py A/results.json B/results.json [--pair char-q25]

For every pair, entry and policy that the files share it prints final accuracy and the paired difference
against the baseline, each as mean ± 95 % interval over all seeds (`compare_stats.pool`, exact from the
summaries). The files must use the same baseline and share no seed: a seed counted twice would shrink the
interval.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mutualrl.app.compare_report import format_ci
from mutualrl.runtime.compare_stats import pool


def main() -> int:
    """Read the files, check they can be pooled, print the pooled table (markdown)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--pair", action="append", help="only these pairs (default: every pair the files share)")
    args = ap.parse_args()
    results = [json.loads(f.read_text()) for f in args.files]
    if len({r["baseline"] for r in results}) != 1:
        sys.exit("the files have different baselines: " + ", ".join(sorted({r["baseline"] for r in results})))
    seen: dict[int, Path] = {}
    for f, r in zip(args.files, results):
        for s in r["seeds"]:
            if s in seen:
                sys.exit(f"seed {s} is in both {seen[s]} and {f}: pool disjoint seeds only")
            seen[s] = f
    pairs = set.intersection(*(set(r["pairs"]) for r in results))
    print(f"seeds {sorted(seen)} ({len(seen)}), baseline {results[0]['baseline']}")
    print("| pair | entry | policy | final accuracy | paired vs baseline | n |\n|---|---|---|---|---|---|")
    for pair in sorted(p for p in pairs if not args.pair or p in args.pair):
        entries = set.intersection(*(set(r["pairs"][pair]) for r in results))
        for entry in sorted(entries, key=lambda e: (e != results[0]["baseline"], e)):
            policies = set.intersection(*(set(r["pairs"][pair][entry]) for r in results))
            for policy in sorted(policies):
                rows = [r["pairs"][pair][entry][policy] for r in results]
                final = pool([row["final_accuracy"] for row in rows])
                diffs = [row["paired_vs_baseline"] for row in rows]
                diff = pool(diffs) if all(diffs) else None
                print(f"| {pair} | {entry} | {policy} | {format_ci(final)} | {format_ci(diff, signed=True)} | "
                      f"{final['n']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
