"""Run outputs under ``runs/<name>/``: metrics.jsonl, curves.png, summary.json, checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.runtime.host import host_info


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    return v


class MetricsWriter:
    """Appends one JSON record per line and flushes, so a crash loses at most the line in flight."""

    def __init__(self, path: Path):
        self.path = path
        self._f = path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        """Append one record (non-finite numbers as null) and flush."""
        self._f.write(json.dumps(_clean(record), sort_keys=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file."""
        self._f.close()


def read_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_curves(records: list[dict], path: Path, title: str = "") -> None:
    """Held-out accuracy against rollouts consumed, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    policies = sorted({r["policy"] for r in records})
    for p in policies:
        pts = [(r["rollouts"],
                r["eval_accuracy"]) for r in records if r["policy"] == p and r.get("eval_accuracy") is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", ms=3, label=p)
    ax.set_xlabel("rollouts sampled by the policy")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def save_checkpoint(dir_: Path, model: PreTrainedModel, tok: PreTrainedTokenizerBase,
                    optimizer: torch.optim.Optimizer | None, state: dict) -> None:
    """A loadable Hugging Face directory plus the trainer state needed to resume."""
    dir_.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dir_)
    tok.save_pretrained(dir_)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), dir_ / "optimizer.pt")
    (dir_ / "trainer_state.json").write_text(json.dumps(state, indent=2))


def policy_summary(*, source: str, params: int, warm_start_steps: int, warm_start_accuracy: float,
                   final_accuracy: float, rollouts: int,
                   rescue_count: int, peer_rejections: dict[str, int], **extra: Any) -> dict:
    """One policy's entry of ``summary.json`` (every launcher writes these keys; ``extra`` adds its own)."""
    return {"source": source, "params": params, "warm_start_steps": warm_start_steps,
            "warm_start_accuracy": warm_start_accuracy,
            "final_accuracy": final_accuracy, "rollouts": rollouts, "rescue_count": rescue_count,
            "peer_rejections": peer_rejections, **extra}


def write_summary(out_dir: Path, name: str, sharing_mode: str, steps: int, policies: dict[str, dict],
                  **extra: Any) -> dict:
    """``summary.json`` of a run, the same shape from `mutualrl run` and `mutualrl up` (what
    `mutualrl compare` and the reports read); ``extra``: what a launcher adds (timings, restarts). ``host`` names the
    machine (CPU, numeric flags, torch) unless the launcher gives its own: a compare warns when one seed's runs came
    from different machines, whose bf16 rounds differently."""
    summary = {"name": name, "sharing_mode": sharing_mode, "steps": steps, "host": host_info(), **extra,
               "policies": policies}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
