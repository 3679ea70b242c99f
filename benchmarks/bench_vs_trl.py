"""mutualrl against TRL's GRPOTrainer on the same work: SmolLM2-135M-Instruct, isolated GRPO, the same
prompts (chat template and instruction), group size, response length, learning rate, clip range,
loss aggregation and number of steps — run by `mutualrl run`, by `mutualrl up` and by TRL (CPU, no
vLLM, fp32, no gradient checkpointing), each in its own process, one after the other, in one
invocation. Prints steps/s, generated tokens/s and peak memory of each and the ratios (goals:
run >= 1.0x TRL, 1.5x hoped for; up >= 0.8x TRL), then our step's stages against their limits: a
plain ``model.generate`` of the same batch and a plain forward/backward/AdamW step of it.

Rates are measured between the end of the first step and the end of the last, so model loading and
process start-up are outside every figure (as in bench_services.py). Every side runs with the same C allocator
settings (``--allocator``): the project's default, freed tensors' pages reused (docs/results/real/bench-malloc.md),
or glibc's own; TRL's process takes the same settings, so the ratio is the trainers'.

    .venv/bin/python benchmarks/bench_vs_trl.py [--steps 4] [--prompts 8] [--group 4] [--max-new-tokens 48]
    [--pause-pgid PGID]   # stop another job's process group while measuring (a background compare)

On a lent GPU (benchmarks/gpu/run_all.py runs it so), where neither SmolLM2's weights nor reasoning-gym
travel: ``--device cuda --model-dir DIR --random-weights --task arithmetic`` gives both sides the same
random-weight network of DIR's config and DIR's tokenizer, and our built-in sums. Random weights sample no
end of sequence, so every row on both sides runs to ``--max-new-tokens``: the same work, rewards meaningless.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from process_memory import run_measured  # noqa: E402

CONFIG = ROOT / "examples" / "real" / "smollm2.yaml"


def step_records(metrics: Path) -> list[dict]:
    """A run's step records (step ≥ 1, with an end time) from its metrics.jsonl, in step order."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return sorted((r for r in recs if r.get("step", 0) >= 1 and "wall_time" in r), key=lambda r: r["step"])


def ours(metrics: Path) -> dict:
    """Step rate, generated tokens, stage seconds and the learner's per-stage peak memory (the most over the steps:
    which stage sets the process's peak) from a run's metrics.jsonl."""
    steps = step_records(metrics)
    ends = [r["wall_time"] for r in steps]
    stages: dict[str, float] = {}
    for r in steps[1:]:
        for k, v in (r.get("stage_seconds") or {}).items():
            stages[k] = stages.get(k, 0.0) + v / (len(steps) - 1)
        stages["generate"] = stages.get("generate", 0.0) + r.get("gen_s", 0.0) / (len(steps) - 1)
    stage_peaks: dict[str, float] = {}
    for r in steps:
        for k, v in (r.get("stage_peak_rss_gib") or {}).items():
            stage_peaks[k] = max(stage_peaks.get(k, 0.0), v)
    span = ends[-1] - ends[0]
    return {"steps_per_s": (len(ends) - 1) / span, "tokens_per_s": sum(r["tokens"] for r in steps[1:]) / span,
            "step_s": span / (len(ends) - 1), "stages": stages, "stage_peak_rss_gib": stage_peaks,
            "reward": [r.get("reward_mean") for r in steps]}


def write_timeline(folder: Path | None, side: str, measured: dict, ends: list[float]) -> None:
    """``folder/side.json``: the side's memory samples ([epoch s, RSS GiB, anon GiB]) and step end times."""
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{side}.json").write_text(json.dumps({"step_ends": ends, "samples": measured["timeline"]}))


# ---------------------------------------------------------------------------------------------- TRL
def trl_worker(spec_file: Path, out_file: Path) -> None:
    """TRL's GRPOTrainer configured to do our work (runs in its own process), with the allocator settings our side
    has (``--allocator``: the environment variable it sets reaches this process too), so the ratio compares the
    trainers and not glibc's settings."""
    from mutualrl.runtime.memory import reuse_freed_pages

    reuse_freed_pages()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(spec_file.read_text())
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(spec["model"], local_files_only=True)
    on_cpu = spec.get("device", "cpu") == "cpu"
    model = AutoModelForCausalLM.from_pretrained(spec["model"], local_files_only=True, dtype=torch.float32)
    answers = {p: a for p, a in zip(spec["prompts"], spec["answers"])}
    rows = [{"prompt": [{"role": "user", "content": p}], "answer": answers[p]} for p in spec["prompts"]]
    from mutualrl.tasks.base import Problem
    from mutualrl.tasks.verifiers import answer_verifier

    verifier = answer_verifier("last_number")

    def reward(prompts, completions, answer, **_):
        return [verifier.score(Problem("", a),
                               c[0]["content"] if isinstance(c, list) else c) for c, a in zip(completions, answer)]

    n, g = spec["prompts_per_step"], spec["group_size"]
    cfg = GRPOConfig(
        output_dir=spec["out"], use_cpu=on_cpu, bf16=spec.get("bf16", False), fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=spec.get("micro_batch") or n * g,
        gradient_accumulation_steps=n * g // (spec.get("micro_batch") or n * g), num_generations=g, num_iterations=1,
        max_completion_length=spec["max_new_tokens"], temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group", shuffle_dataset=False,
        max_steps=spec["steps"], logging_steps=1, save_strategy="no", report_to="none", disable_dropout=True,
        dataloader_num_workers=0, seed=0,
    )
    ends: list[float] = []
    records: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.time())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                records.append({**logs, "step": state.global_step})

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok,
                          callbacks=[Clock()])
    trainer.train()
    lengths = [r["completions/mean_length"] for r in records if r.get("completions/mean_length") is not None]
    rewards = [r["reward"] for r in records if r.get("reward") is not None]
    out_file.write_text(json.dumps({"ends": ends, "mean_lengths": lengths, "rewards": rewards}))


# ------------------------------------------------------------------------------------------- limits
def limits(model_dir: str, prompts: list[str], group: int, max_new: int, completion_len: float) -> dict:
    """The same batch through plain transformers: sampled ``model.generate`` and one plain
    forward/backward/AdamW step over prompt + mean-length completion."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                     tokenize=False) for p in prompts for _ in range(group)]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new,
                             pad_token_id=tok.pad_token_id)
    gen_s = time.perf_counter() - t0
    new = (out[:, batch["input_ids"].shape[1]:] != tok.pad_token_id).sum().item()
    width = batch["input_ids"].shape[1] + int(round(completion_len))
    ids = torch.randint(0, len(tok), (len(texts), width))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.train()
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    train_s = time.perf_counter() - t0
    return {"generate_s": gen_s, "generate_tokens_per_s": new / gen_s, "train_s": train_s}


# --------------------------------------------------------------------------------------------- main
def resume_group(pgid: int) -> None:
    """SIGCONT the process group stopped while measuring. A stopped process keeps its memory, and the kernel's OOM
    killer may have ended it while a side ran: say so, and keep the figures."""
    try:
        os.killpg(pgid, signal.SIGCONT)
    except ProcessLookupError:
        print(f"process group {pgid} is gone (killed while stopped: the OOM killer? see dmesg); figures kept",
              file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: ours bf16-mixed (model.dtype), TRL bf16=True (autocast); both fp32 master weights.")
    ap.add_argument("--micro-batch", type=int, default=None,
                    help="Rows per forward/backward: ours algorithm.micro_batch_rows, TRL per_device_train_batch_size "
                         "(and gradient_accumulation_steps = rows per step / this).")
    ap.add_argument("--skip", action="append", default=[], choices=["run", "up", "trl", "limits"])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="Where both sides sample and train.")
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="A model folder (config, tokenizer) instead of the smollm2-135m-instruct preset.")
    ap.add_argument("--random-weights", action="store_true",
                    help="Weights initialised from --model-dir's config at seed 0 (its weights are not read).")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                    help="More overrides of our config (e.g. weights.share_in_process=false); TRL is not changed.")
    ap.add_argument("--task", choices=["reasoning-gym", "arithmetic"], default="reasoning-gym",
                    help="arithmetic: our built-in 1-2 digit sums (no reasoning-gym package needed).")
    ap.add_argument("--pause-pgid", type=int, default=None,
                    help="SIGSTOP this process group while measuring, SIGCONT after. A stopped process keeps its "
                         "memory: leave room for the sides' peaks (TRL's whole batch in fp32: ~11.5 GiB for SmolLM2).")
    ap.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    ap.add_argument("--timeline", type=Path, default=None,
                    help="A folder: each side's resident memory every 0.25 s and its step end times (SIDE.json), "
                         "to see which phase sets a peak.")
    ap.add_argument("--keep", type=Path, default=None,
                    help="A folder to run in and keep (each side's run folder and log) instead of a temporary one. "
                         "It keeps each side's final checkpoint too (a few GB for SmolLM2): delete it when read.")
    ap.add_argument("--allocator", choices=["reuse", "glibc"], default="reuse",
                    help="The C allocator's settings on every side, TRL's included: reuse (the project's default, "
                         "mutualrl.runtime.memory.reuse_freed_pages) or glibc (its own defaults, "
                         "MUTUALRL_REUSE_FREED_PAGES=0).")
    ap.add_argument("--trl-worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_worker:
        trl_worker(*args.trl_worker)
        return
    from mutualrl.runtime.memory import REUSE_FREED_PAGES_ENV

    os.environ[REUSE_FREED_PAGES_ENV] = "1" if args.allocator == "reuse" else "0"
    if args.pause_pgid:
        os.killpg(args.pause_pgid, signal.SIGSTOP)
    try:
        figures = measure(args)
    finally:
        if args.pause_pgid:
            resume_group(args.pause_pgid)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if missed(figures):  # `make bench` names the benchmarks whose goals were missed
        raise SystemExit(1)


def missed(f: dict) -> list[str]:
    """The goals this invocation measured and missed (run >= 1.0x TRL, up >= 0.8x TRL)."""
    if "trl" not in f:
        return []
    return [name for name, goal in (("run", 1.0),
                                    ("up",
                                     0.8)) if name in f and f[name]["steps_per_s"] / f["trl"]["steps_per_s"] < goal]


ARITHMETIC_TASK = {"name": "arithmetic", "min_digits": 1, "max_digits": 2, "operators": "+", "train_size": 2000,
                   "eval_size": 64, "answer_format": "last_number"}
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "special_tokens_map.json")


def random_weights_dir(source: Path, out: Path) -> Path:
    """A model folder with ``source``'s config and tokenizer and weights initialised at seed 0: the real
    architecture's cost without its weights (which do not travel to a lent device)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in MODEL_FILES:
        if name != "config.json" and (source / name).is_file():
            shutil.copy(source / name, out / name)
    return out


@contextlib.contextmanager
def _workdir(keep: Path | None):
    """The folder the sides run in: ``keep`` (left in place, to read the services' logs after), else a temporary one."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def measure(args) -> dict:
    from mutualrl.config import load_config
    from mutualrl.runtime.distributor import PromptDistributor
    from mutualrl.runtime.policy_setup import build_task_from_config, task_instruction

    with _workdir(args.keep) as tmp:
        if args.model_dir is None:
            from mutualrl.models.pretrained import get_model

            model_dir = str(get_model("smollm2-135m-instruct", echo=print))
        else:
            folder = random_weights_dir(args.model_dir, tmp / "model") if args.random_weights else args.model_dir
            model_dir = str(folder)
        sets = [f"policies.smollm2.model.path={model_dir}", f"budget.steps={args.steps}",
                f"budget.prompts_per_step={args.prompts}",
                f"budget.group_size={args.group}", f"budget.max_new_tokens={args.max_new_tokens}",
                f"policies.smollm2.optim.lr={args.lr}",
                "eval.every=100000", "eval.size=8",
                # `run` saves its state once, at the end; `up` checkpoints every step by default (1.6 GB for
                # SmolLM2): the same work is one checkpoint, at the end, for both
                f"checkpoint.every={args.steps}",
                f"policies.smollm2.model.dtype={'bf16-mixed' if args.dtype == 'bf16' else 'float32'}"]
        if args.device != "cpu":
            sets.append(f"policies.smollm2.engine.device={args.device}")
        if args.micro_batch:
            sets.append(f"algorithm.micro_batch_rows={args.micro_batch}")
        sets += args.sets
        raw = yaml.safe_load(CONFIG.read_text())
        if args.task == "arithmetic":
            raw["task"] = dict(ARITHMETIC_TASK)
        from mutualrl.config.loading import apply_overrides

        cfg_file = tmp / "cfg.yaml"
        cfg_file.write_text(yaml.safe_dump(apply_overrides(raw, sets)))
        cfg = load_config(cfg_file)
        task, _ = build_task_from_config(cfg)
        instruction = task_instruction(cfg)
        # the prompts our run trains on, in its order, so TRL sees the same ones
        distributor = PromptDistributor(task.train, cfg.budget.prompts_per_step, seed=cfg.seed)
        problems = [p for step in range(1, args.steps + 1) for p in distributor.batch(step)]
        name = (f"{'random weights of ' if args.random_weights else ''}"
                f"{args.model_dir.name if args.model_dir else 'SmolLM2-135M-Instruct'}")
        figures: dict = {"steps": args.steps, "prompts_per_step": args.prompts, "group_size": args.group,
                         "max_new_tokens": args.max_new_tokens, "device": args.device, "task": args.task,
                         "threads": os.cpu_count(), "model": f"{name} ({args.dtype})",
                         "micro_batch": args.micro_batch, "allocator": args.allocator}
        cli = [sys.executable, "-m", "mutualrl.app.cli"]
        for side in ("run", "up"):
            if side not in args.skip:
                m = run_measured([*cli, side, str(cfg_file), "--out", str(tmp / side)], tmp / f"{side}.log")
                figures[side] = {**ours(tmp / side / "metrics.jsonl"), "peak_rss_gib": m["peak_rss_gib"],
                                 "wall_s": m["wall_s"], "host": m["host"]}
                ends = [r["wall_time"] for r in step_records(tmp / side / "metrics.jsonl")]
                write_timeline(args.timeline, side, m, ends)
                print(f"{side}: {figures[side]['step_s']:.2f} s/step, peak {m['peak_rss_gib']:.1f} GiB", flush=True)
        if "trl" not in args.skip:
            spec = {"model": model_dir, "prompts": [f"{p.prompt}\n\n{instruction}" for p in problems],
                    "answers": [p.answer for p in problems],
                    "prompts_per_step": args.prompts, "group_size": args.group, "max_new_tokens": args.max_new_tokens,
                    "lr": args.lr, "bf16": args.dtype == "bf16", "micro_batch": args.micro_batch,
                    "steps": args.steps, "out": str(tmp / "trl"), "device": args.device}
            (tmp / "trl.json").write_text(json.dumps(spec))
            m = run_measured([sys.executable, __file__, "--trl-worker", str(tmp / "trl.json"),
                              str(tmp / "trl-out.json")], tmp / "trl.log")
            res = json.loads((tmp / "trl-out.json").read_text())
            ends = res["ends"]
            write_timeline(args.timeline, "trl", m, ends)
            span = ends[-1] - ends[0]
            tokens = sum(length * args.prompts * args.group for length in res["mean_lengths"][1:])
            figures["trl"] = {"steps_per_s": (len(ends) - 1) / span, "tokens_per_s": tokens / span,
                              "step_s": span / (len(ends) - 1),
                              "peak_rss_gib": m["peak_rss_gib"], "wall_s": m["wall_s"], "reward": res["rewards"],
                              "host": m["host"]}
            print(f"trl: {figures['trl']['step_s']:.2f} s/step, peak {m['peak_rss_gib']:.1f} GiB", flush=True)
        if ("limits" not in args.skip and "run" in figures and args.dtype == "fp32" and not args.micro_batch
                and args.device == "cpu"):
            mean_len = figures["run"]["tokens_per_s"] * figures["run"]["step_s"] / (args.prompts * args.group)
            figures["limits"] = limits(model_dir, [f"{p.prompt}\n\n{instruction}" for p in problems[: args.prompts]],
                                       args.group,
                                       args.max_new_tokens, mean_len)
    report(figures)
    return figures


def report(f: dict) -> None:
    print(f"\n{f['model']} on {f.get('device', 'cpu')}, isolated GRPO: {f['steps']} steps of "
          f"{f['prompts_per_step']} prompts x {f['group_size']} samples, <= {f['max_new_tokens']} new tokens, "
          f"micro-batch {f.get('micro_batch') or 'none'}, {f['threads']} cores, allocator "
          f"{f.get('allocator', 'glibc')} on every side")
    print(f"{'':8} {'steps/s':>9} {'s/step':>8} {'gen tok/s':>10} {'peak GiB':>9} {'host free GiB':>14} "
          f"{'major faults':>13}")
    for name in ("run", "up", "trl"):
        if name in f:
            r, host = f[name], f[name].get("host", {})
            print(f"{name:8} {r['steps_per_s']:9.4f} {r['step_s']:8.1f} {r['tokens_per_s']:10.1f} "
                  f"{r['peak_rss_gib']:9.1f} {host.get('available_gib_at_start', float('nan')):14.1f} "
                  f"{host.get('major_faults', 0):13d}")
    if "trl" in f:
        for name, goal in (("run", 1.0), ("up", 0.8)):
            if name in f:
                ratio = f[name]["steps_per_s"] / f["trl"]["steps_per_s"]
                print(f"{name} / trl steps/s: {ratio:.2f}x (goal >= {goal}){'' if ratio >= goal else '  MISSED'}")
    if "limits" in f and "run" in f:
        st, lim = f["run"]["stages"], f["limits"]
        print("\nour step's stages (mean over steps 2..) against the limits of the same batch:")
        print(f"  generate     {st.get('generate', 0):6.1f} s   plain model.generate {lim['generate_s']:6.1f} s  (ours "
              f"/ limit {st.get('generate', 0) / lim['generate_s']:.2f})")
        print(f"  log-probs    {st.get('logprob', 0):6.1f} s   (none: the sampler's log-probs are π_old, the learner "
              "does not recompute them)")
        print(f"  train        {st.get('train', 0):6.1f} s   plain forward/backward/AdamW {lim['train_s']:6.1f} s  "
              f"(ours / limit {st.get('train', 0) / lim['train_s']:.2f})")
        print(f"  weight sync  {st.get('weight_sync', 0):6.1f} s   (TRL samples with the trained module itself: 0)")


if __name__ == "__main__":
    main()
