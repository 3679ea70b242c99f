"""`mutualrl mwra simulate`: the strategies side by side, as a table, JSON and a plot."""

from __future__ import annotations

from pathlib import Path

from mutualrl.services.mwra.simulator import SimResult, build_scenario, compare

COLUMNS = ("makespan/LB", "makespan/gang LB", "util", "max step", "min step", "peer lag", "re-plans", "partial GPU-s",
           "no progress")


def simulate(policies: int, gpus: int, cost_ratio: float, seed: int, steps: int, drift: float,
             node_loss_step: int | None) -> dict:
    """Run the MWRA simulator's strategies on one scenario and return the scenario and each strategy's result."""
    sc = build_scenario(policies, gpus, cost_ratio, seed=seed, steps=steps, drift=drift, node_loss_step=node_loss_step)
    results = compare(sc)
    return {
        "scenario": {"policies": policies, "gpus": gpus, "cost_ratio": cost_ratio, "seed": seed, "steps": steps,
                     "drift": drift,
                     "node_loss_step": node_loss_step, "move_cost_s": sc.move_cost_s, "staleness": sc.staleness},
        "strategies": {k: (v.to_dict() if v is not None else None) for k, v in results.items()},
        "_results": results,
    }


def table_rows(results: dict[str, SimResult | None]) -> list[list[str]]:
    """The simulation results as table rows, one per strategy."""
    rows = []
    for name, r in results.items():
        if r is None:
            rows.append([name, "n/a (N > 4)"] + [""] * (len(COLUMNS) - 1))
            continue
        ratio = "stalled" if r.makespan_over_lower_bound is None else f"{r.makespan_over_lower_bound:.3f}"
        gang = r.makespan_over_gang_bound
        rows.append([name, ratio, "stalled" if gang is None else f"{gang:.3f}",
                     f"{r.utilisation:.1%}", f"{r.max_step_s:.1f}s", f"{r.min_step_s:.1f}s",
                     str(r.peer_lag_steps), str(r.replans),
                     f"{r.partial_gang_gpu_seconds:.0f}", f"{r.longest_no_progress_s:.0f}s"])
    return rows


def plot(results: dict[str, SimResult | None], path: Path, title: str) -> None:
    """Each strategy's step completions over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        if r is None or not r.timeline:
            continue
        times = sorted(t for t, _, _ in r.timeline)
        policies = len({p for _, p, _ in r.timeline})
        ax.plot([t / 3600 for t in times], [(i + 1) / policies for i in range(len(times))], label=name)
    ax.set_xlabel("hours")
    ax.set_ylabel("fleet steps done (mean per policy)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
