"""mutualrl's GPU measurements, section by section, each in its own guard (run through run_all.sh).

Sections (random-weight architectures built from their configs: real weights and vLLM/SGLang do not fit
what travels to a lent device):

- ``env``: the device, library versions, the datasheet bf16 peak and a measured large bf16 matmul;
- ``learner_step``: one GRPO step of 64 rows x 512 tokens in bf16-mixed through the learner's own path
  (micro-batched log-probs, PPO-clip token-mean loss, backward, fused AdamW) for SmolLM2-135M,
  Qwen2.5-0.5B and Qwen2.5-1.5B: tokens/s and MFU (6·N·tokens against the datasheet and the measured peak);
- ``logprob_memory``: peak memory of our selective log-probs against a full log-softmax at the 151,936
  vocabulary, forward and backward;
- ``engine``: the ``hf`` engine's generated tokens/s against plain ``model.generate`` on the same batch;
- ``weights_transport``: a version of Qwen2.5-0.5B's bf16 weights from a learner process to an engine
  process on one device through CUDA IPC handles (NCCL refuses two ranks on one GPU), against the
  device-to-device copy bound (on the CPU: POSIX shared memory against a memcpy);
- ``run_5_steps``: a 5-step two-policy ``mutualrl run`` on the device;
- ``run_real_shapes``: 3 steps of ``mutualrl run`` with two policies of the real presets' shapes (bf16-mixed);
- ``cpu_bf16``: where the host's CPU has bf16 instructions, our fp32 and bf16-mixed steps and TRL's bf16 step on
  it (benchmarks/bench_vs_trl.py, SmolLM2's shape with random weights, 4 x 8 x 48);
- ``vs_trl_cuda``: the same against TRL's ``GRPOTrainer`` on the device, bf16 and fp32;
- ``sampling_copy``: our bf16 step with the engine sampling a bf16 copy of the weights instead of the
  learner's module under autocast (``weights.share_in_process: false``), on the device and the bf16 CPU;
- ``pair_memory_bf16``: SmolLM2 + Qwen2.5-Coder-0.5B's shapes under ``mutualrl up`` (and ``run``) on a bf16 host
  CPU: does the pair fit in 16 GiB in bf16-mixed (benchmarks/bench_pair_memory.py)?

``--dry-run``: the same code on the CPU with tiny shapes (make test). The JSON is rewritten after every
section; a failed section keeps its traceback there and costs one figure, not the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

# bf16 dense tensor-core peaks from the vendors' datasheets (FLOP/s, without sparsity)
DATASHEET_BF16 = {"H200": 989.4e12, "H100 80GB HBM3": 989.4e12, "H100 PCIe": 756.5e12, "H100": 989.4e12,
                  "A100": 312e12, "L40S": 362.05e12, "L4": 121e12}

ARCHS = {  # the published configs' shapes (tie_word_embeddings as released)
    "smollm2-135m": dict(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True, rope_theta=100000.0),
    "qwen2.5-0.5b": dict(family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen2.5-1.5b": dict(family="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         tie_word_embeddings=True, rope_theta=1000000.0),
}
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


class Bench:
    """The run's settings: device, sizes (full or dry), time budget, and the JSON it keeps rewriting."""

    def __init__(self, args):
        self.dry = args.dry_run
        self.device = "cpu" if self.dry or not torch.cuda.is_available() else "cuda"
        self.json = args.json
        self.budget_s = args.budget_s
        self.micro_rows = args.micro_rows
        self.started = args.started or time.time()
        self.out: dict = {"dry_run": self.dry, "device": self.device, "sections": {}}

    def left_s(self) -> float:
        return self.budget_s - (time.time() - self.started)

    def save(self) -> None:
        self.json.parent.mkdir(parents=True, exist_ok=True)
        self.json.write_text(json.dumps(self.out, indent=2, default=str))

    def section(self, name: str, fn, need_s: float) -> None:
        """Run one section in its guard; skipped (said why) when less than ``need_s`` of the budget is left."""
        if self.left_s() < need_s:
            self.out["sections"][name] = {"status": "skipped", "why": f"{self.left_s():.0f} s left, needs {need_s}"}
            self.save()
            return
        t0 = time.time()
        print(f"== {name}", flush=True)
        try:
            if name in os.environ.get("MUTUALRL_GPU_FAIL", "").split(","):  # the guard's own test plants one
                raise RuntimeError(f"planted failure in {name} (MUTUALRL_GPU_FAIL)")
            figures = fn(self)
            self.out["sections"][name] = {"status": "ok", "seconds": round(time.time() - t0, 1), **figures}
        except Exception:  # noqa: BLE001 — a failed section is recorded and the next one runs
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)
            self.out["sections"][name] = {"status": "failed", "seconds": round(time.time() - t0, 1),
                                          "traceback": tb[-4000:]}
        finally:
            if self.device == "cuda":
                torch.cuda.empty_cache()
        print(json.dumps(self.out["sections"][name], default=str)[:600], flush=True)
        self.save()

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def peak_reset(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if self.device == "cuda" else None


def build(arch: str, b: Bench, dtype=torch.float32):
    """A random-weight model of ``arch`` (tiny under --dry-run) on the bench's device."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(ARCHS[arch])
    family = spec.pop("family")
    if b.dry:
        spec.update(TINY)
    cfg_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    cfg = cfg_cls(**spec, max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                  attn_implementation="sdpa")
    with torch.device(b.device):
        model = model_cls(cfg).to(dtype)
    return model


def n_params(model, exclude_embedding: bool = True) -> int:
    """Parameters that do matmul work per token (the input embedding is a lookup)."""
    emb = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is emb
    return total - (0 if tied or not exclude_embedding else emb.numel())


# ---------------------------------------------------------------------------------------------- sections
def env(b: Bench) -> dict:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    if b.device == "cuda":
        name = torch.cuda.get_device_name()
        out["gpu"] = name
        out["datasheet_bf16_tflops"] = next((v / 1e12 for k, v in DATASHEET_BF16.items() if k in name), None)
        n = 8192
        dt = torch.bfloat16
    else:
        out["gpu"] = None
        out["datasheet_bf16_tflops"] = None
        n, dt = 256, torch.float32
    x = torch.randn(n, n, device=b.device, dtype=dt)
    y = torch.randn(n, n, device=b.device, dtype=dt)
    for _ in range(3):
        x @ y
    b.sync()
    t0 = time.perf_counter()
    reps = 10
    for _ in range(reps):
        x @ y
    b.sync()
    out["measured_matmul_tflops"] = 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12
    out["matmul"] = f"{n}x{n}x{n} {str(dt).split('.')[-1]}"
    b.peak_matmul = out["measured_matmul_tflops"] * 1e12
    b.datasheet = (out["datasheet_bf16_tflops"] or 0) * 1e12 or None
    return out


def learner_step(b: Bench) -> dict:
    """One GRPO step through the learner's path (micro_batches.py) per architecture."""
    from mutualrl.grpo import get_policy_loss
    from mutualrl.models.precision import resolve_precision
    from mutualrl.services.learner.micro_batches import LearnerForward, plan_micro_batches

    rows, prompt_len, completion_len = (64, 64, 448) if not b.dry else (8, 8, 24)
    micro_rows = (b.micro_rows or 16) if not b.dry else 4
    precision = resolve_precision("bf16-mixed" if b.device == "cuda" else "float32", pretrained=True,
                                  device=b.device)
    loss_fn = get_policy_loss("grpo")
    out = {"rows": rows, "tokens_per_row": prompt_len + completion_len, "precision": precision.name,
           "micro_batch_rows": micro_rows, "archs": {}}
    for arch in ARCHS:
        if b.left_s() < (60 if not b.dry else 5):
            out["archs"][arch] = {"status": "skipped", "why": "budget"}
            continue
        try:
            model = build(arch, b)
            model.train()
            vocab = model.config.vocab_size
            g = torch.Generator().manual_seed(0)
            prompts = torch.randint(3, vocab, (rows, prompt_len), generator=g).tolist()
            completions = torch.randint(3, vocab, (rows, completion_len), generator=g).tolist()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=b.device == "cuda")
            fwd = LearnerForward(model, pad_id=2, context=lambda: precision.context(b.device))
            plan = plan_micro_batches([prompt_len + completion_len] * rows, max_rows=micro_rows)
            adv = torch.randn(rows, device=b.device)
            times = []
            b.peak_reset()
            # π_old: the learner's own numbers, slightly moved (a sampler's); not timed
            old = fwd.logprobs_no_grad(prompts, completions, plan)
            old = old + 0.01 * torch.randn_like(old)
            mask = torch.ones_like(old)

            def loss_of(leaf: torch.Tensor, old=old, mask=mask) -> torch.Tensor:
                return loss_fn(leaf, old, adv, mask).loss

            for _ in range(2):  # the first is warm-up (kernels, allocator)
                b.sync()
                t0 = time.perf_counter()
                logp = fwd.accumulate_one_pass(prompts, completions, plan, old, loss_of)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                b.sync()
                times.append(time.perf_counter() - t0)
            step_s = times[-1]
            scaled_s = _scaled_loss_step(b, model, fwd, opt, loss_fn, prompts, completions, plan, old, adv)
            tokens = rows * (prompt_len + completion_len)
            n = n_params(model)
            useful = 6 * n * tokens / step_s  # forward + backward of every token
            fig = {"params": sum(p.numel() for p in model.parameters()), "matmul_params": n, "step_s": step_s,
                   "tokens_per_s": tokens / step_s, "useful_tflops": useful / 1e12,
                   "peak_gib": b.peak_gib(), "scaled_loss_step_s": scaled_s,
                   "ours_over_scaled_loss": step_s / scaled_s}
            if getattr(b, "datasheet", None):
                fig["mfu_datasheet"] = useful / b.datasheet
            if getattr(b, "peak_matmul", None):
                fig["mfu_measured_peak"] = useful / b.peak_matmul
            out["archs"][arch] = fig
            del model, opt, logp, old
        except Exception:  # noqa: BLE001 — one architecture's failure (out of memory) keeps the others
            out["archs"][arch] = {"status": "failed", "traceback": traceback.format_exc()[-2000:]}
        if b.device == "cuda":
            torch.cuda.empty_cache()
    return out


def _scaled_loss_step(b, model, fwd, opt, loss_fn, prompts, completions, plan, old, adv) -> float:
    """The baseline of the usual gradient accumulation (TRL's shape): per micro-batch one forward with a
    graph, the loss on that micro-batch weighted by its share of rows, backward; one optimizer step. The
    same 6·N·tokens of work as our one pass per micro-batch (docs/algorithms.md §7.2), which differs only
    in running the loss over the whole mini-batch's leaf (exact for every aggregation)."""
    T = old.shape[1]
    times = []
    for _ in range(2):
        b.sync()
        t0 = time.perf_counter()
        for idx in plan:
            part = fwd.logprobs([prompts[i] for i in idx], [completions[i] for i in idx])
            o = old[idx, T - part.shape[1]:]
            loss = loss_fn(part, o, adv[idx], torch.ones_like(part)).loss * (len(idx) / len(prompts))
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        b.sync()
        times.append(time.perf_counter() - t0)
    return times[-1]


def logprob_memory(b: Bench) -> dict:
    """Selective log-probs against log_softmax + gather at the 151,936 vocabulary, forward and backward."""
    from mutualrl.models.generation import selective_logprobs

    rows, T = (16, 512) if not b.dry else (2, 16)
    V = 151936
    dtype = torch.bfloat16 if b.device == "cuda" else torch.float32
    out = {"rows": rows, "positions": T, "vocab": V, "logits_dtype": str(dtype).split(".")[-1]}
    targets = torch.randint(0, V, (rows, T), device=b.device)
    for name in ("selective", "full_log_softmax"):
        logits = torch.randn(rows, T, V, device=b.device, dtype=dtype, requires_grad=True)
        b.peak_reset()
        base = torch.cuda.memory_allocated() if b.device == "cuda" else 0
        t0 = time.perf_counter()
        if name == "selective":
            lp = selective_logprobs(logits, targets)
        else:
            lp = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).squeeze(-1)
        lp.sum().backward()
        b.sync()
        peak = b.peak_gib()
        out[name] = {"seconds": time.perf_counter() - t0,
                     "peak_above_logits_gib": (peak - base / 2**30) if peak is not None else None}
        del logits, lp
    s, f = out["selective"]["peak_above_logits_gib"], out["full_log_softmax"]["peak_above_logits_gib"]
    out["memory_ratio"] = s / f if s is not None and f else None
    return out


def engine(b: Bench) -> dict:
    """The hf engine's sampler against model.generate on the same batch (random weights: no EOS is sampled,
    both run every row to the length)."""
    from mutualrl.models.generation import sample

    rows, prompt_len, new = (64, 128, 256) if not b.dry else (4, 8, 8)
    dtype = torch.bfloat16 if b.device == "cuda" else torch.float32
    model = build("smollm2-135m", b, dtype).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, vocab, (rows, prompt_len), generator=g)
    out = {"rows": rows, "new_tokens": new, "dtype": str(dtype).split(".")[-1]}
    for name in ("ours", "generate", "ours"):  # ours twice: the first run warms the kernels up
        b.sync()
        t0 = time.perf_counter()
        if name == "ours":
            sample(model, prompts.tolist(), eos_id=-1, pad_id=2, max_new_tokens=new, temperature=1.0)
        else:
            with torch.no_grad():
                model.generate(input_ids=prompts.to(b.device), attention_mask=torch.ones_like(prompts).to(b.device),
                               do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                               min_new_tokens=new, pad_token_id=2)
        b.sync()
        out[f"{name}_tokens_per_s"] = rows * new / (time.perf_counter() - t0)
    out["ours_over_generate"] = out["ours_tokens_per_s"] / out["generate_tokens_per_s"]
    return out


def _engine_side(conn, device: str, numel: dict, versions: int) -> None:
    """The engine process: maps each version's tensors from the learner and copies them into its own."""
    own = {k: torch.empty(n, dtype=torch.bfloat16, device=device) for k, n in numel.items()}
    for _ in range(versions):
        shared = conn.recv()  # CUDA tensors arrive as IPC handles; CPU tensors as shared-memory segments
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k, t in shared.items():
            own[k].copy_(t)
        if device == "cuda":
            torch.cuda.synchronize()
        conn.send(time.perf_counter() - t0)
        del shared


def weights_transport(b: Bench) -> dict:
    import torch.multiprocessing as mp

    model = build("qwen2.5-0.5b", b, torch.bfloat16)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if b.device == "cpu":
        for v in state.values():
            v.share_memory_()
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    versions = 5
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_engine_side, args=(there, b.device, {k: v.shape for k, v in state.items()}, versions))
    proc.start()
    per_version = []
    for v in range(versions):
        with torch.no_grad():
            for t in state.values():
                t.add_(0.001)  # a new version in place (the learner's step)
        b.sync()
        t0 = time.perf_counter()
        here.send(state)
        copy_s = here.recv()
        per_version.append({"round_trip_s": time.perf_counter() - t0, "copy_s": copy_s})
    proc.join(timeout=60)
    # the bound: the same bytes copied device to device in one process
    dst = {k: torch.empty_like(v) for k, v in state.items()}
    b.sync()
    t0 = time.perf_counter()
    for k, v in state.items():
        dst[k].copy_(v)
    b.sync()
    bound_s = time.perf_counter() - t0
    best = min(p["round_trip_s"] for p in per_version[1:] or per_version)
    return {"bytes": nbytes, "mechanism": "CUDA IPC handles" if b.device == "cuda" else "POSIX shared memory",
            "versions": per_version, "best_round_trip_s": best, "copy_bound_s": bound_s,
            "bound_over_ours": bound_s / best, "engine_exit": proc.exitcode}


# what both `mutualrl run` sections train: SGT on 1-2 digit sums, 32 prompts x 8 a step
_RUN_TAIL = """task: {{name: arithmetic, min_digits: 1, max_digits: 2, operators: "+", train_size: 2000, eval_size: 64}}
sharing: {{mode: sgt}}
budget: {{steps: STEPS, prompts_per_step: 32, group_size: 8, max_new_tokens: {new}}}
eval: {{every: {every}, size: 64}}
"""

RUN_CONFIG = """
name: gpu-two-policies
seed: 0
policies:
  - name: llama-char
    model: {family: llama, hidden_size: 128, num_layers: 4, num_heads: 4, intermediate_size: 512, max_positions: 64}
    tokenizer: {kind: char}
    engine: {device: DEVICE}
    warm_start: {enabled: false}
  - name: qwen-bpe
    model: {family: qwen2, hidden_size: 128, num_layers: 4, num_heads: 4, intermediate_size: 512, max_positions: 64}
    tokenizer: {kind: bpe, vocab_size: 300}
    engine: {device: DEVICE}
    warm_start: {enabled: false}
""" + _RUN_TAIL.format(new=6, every=5)


def _mutualrl_run(b: Bench, config_text: str) -> tuple[float, list[dict]]:
    """`mutualrl run` of this config in a subprocess (its own cache): the wall seconds and the step records."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "cfg.yaml"
        cfg.write_text(config_text)
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "run", str(cfg), "--out", f"{tmp}/run"],
                              capture_output=True, text=True, timeout=max(30, b.left_s() - 10),
                              env={**os.environ, "MUTUALRL_CACHE": f"{tmp}/cache"})
        wall = time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"mutualrl run exited {proc.returncode}:\n{proc.stdout[-1500:]}\n{proc.stderr[-2500:]}")
        recs = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines() if line]
    return wall, [r for r in recs if "step_s" in r and r.get("step", 0) >= 1]


def run_5_steps(b: Bench) -> dict:
    steps = 5 if not b.dry else 2
    text = RUN_CONFIG.replace("DEVICE", b.device).replace("STEPS", str(steps))
    wall, trained = _mutualrl_run(b, text.replace("prompts_per_step: 32", "prompts_per_step: 4") if b.dry else text)
    if len(trained) != 2 * steps:
        raise RuntimeError(f"{len(trained)} step records of {2 * steps} expected")
    return {"steps": steps, "wall_s": wall, "step_records": len(trained),
            "step_s_mean": sum(r["step_s"] for r in trained) / len(trained),
            "reward_mean_last": {r["policy"]: r["reward_mean"] for r in trained if r["step"] == steps}}


SHAPES_CONFIG = """
name: gpu-real-shapes
seed: 0
policies:
  - name: smollm2-shape
    model: {family: llama, hidden_size: 576, num_layers: 30, num_heads: 9, intermediate_size: 1536,
            max_positions: 256, dtype: DTYPE}
    tokenizer: {kind: char}
    engine: {device: DEVICE}
    warm_start: {enabled: false}
  - name: qwen05b-shape
    model: {family: qwen2, hidden_size: 896, num_layers: 24, num_heads: 14, intermediate_size: 4864,
            max_positions: 256, dtype: DTYPE}
    tokenizer: {kind: qwen2.5}
    engine: {device: DEVICE}
    warm_start: {enabled: false}
""" + _RUN_TAIL.format(new=64, every=100)


def run_real_shapes(b: Bench) -> dict:
    """`mutualrl run` of two policies of the real presets' shapes (SmolLM2-135M as a llama, Qwen2.5-0.5B as a
    qwen2 with the real 151k vocabulary), random weights, bf16-mixed on the device: what a step of the real
    pair costs there, sampling included (random weights sample no EOS: every row runs to 64 new tokens)."""
    steps = 3 if not b.dry else 1
    text = SHAPES_CONFIG.replace("DEVICE", b.device).replace("STEPS", str(steps))
    text = text.replace("DTYPE", "bf16-mixed" if b.device == "cuda" else "float32")
    if b.dry:
        text = (text.replace("hidden_size: 576, num_layers: 30, num_heads: 9, intermediate_size: 1536",
                             "hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128")
                .replace("hidden_size: 896, num_layers: 24, num_heads: 14, intermediate_size: 4864",
                         "hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128")
                .replace("prompts_per_step: 32", "prompts_per_step: 2").replace("max_new_tokens: 64",
                                                                               "max_new_tokens: 4"))
    wall, trained = _mutualrl_run(b, text)
    last = {r["policy"]: {k: v for k, v in r.items() if k.endswith("_s") and isinstance(v, (int, float))}
            for r in trained if r["step"] == steps}
    return {"steps": steps, "wall_s": wall, "rows_per_step": 32 * 8, "max_new_tokens": 64,
            "timings_last_step": last}


# ------------------------------------------------------------------------------ against TRL, same process each
SMOLLM2_SHAPE = ROOT / "benchmarks" / "gpu" / "wheels" / "smollm2-135m-shape"  # `make gpu-wheels`: config, tokenizer
QWEN_CODER_SHAPE = ROOT / "benchmarks" / "gpu" / "wheels" / "qwen2.5-coder-0.5b-shape"


def _tiny_model_dir(out: Path) -> Path:
    """--dry-run's model folder: a 2-layer qwen2 with the Qwen2.5 tokenizer and a chat template (TRL needs one)."""
    from transformers import Qwen2Config

    from mutualrl.models.production import qwen25_tokenizer

    tok = qwen25_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    Qwen2Config(**{**TINY, "vocab_size": len(tok)}, max_position_embeddings=512, tie_word_embeddings=True,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(out)
    return out


def _benchmark_json(b: Bench, script: str, args: list[str]) -> dict:
    """benchmarks/<script> with ``args`` in a subprocess, within the budget: the figures its ``--json`` wrote (a
    script that exits non-zero after writing them, a missed goal, still gives them); none written is an error
    carrying the end of its output."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)],
                              capture_output=True, text=True, timeout=max(30, b.left_s() - 5))
        print(proc.stdout[-1500:], flush=True)
        if not out.is_file():
            raise RuntimeError(f"{script} exited {proc.returncode}:\n{proc.stdout[-1500:]}\n{proc.stderr[-2500:]}")
        return json.loads(out.read_text())


def _vs_trl(b: Bench, model_dir: Path, device: str, dtype: str, skip: list[str], sets: tuple[str, ...] = ()) -> dict:
    """benchmarks/bench_vs_trl.py in a subprocess (each side in its own process there): SmolLM2's shape with
    random weights, our built-in sums, 4 x 8 rows of 48 new tokens (the issue's figure), 4 steps."""
    size = ["--steps", "4", "--prompts", "4", "--group", "8", "--max-new-tokens", "48"]
    if b.dry:
        size = ["--steps", "2", "--prompts", "2", "--group", "2", "--max-new-tokens", "4"]
    figures = _benchmark_json(b, "bench_vs_trl.py", [
        *size, "--device", device, "--dtype", dtype, "--model-dir", str(model_dir), "--random-weights", "--task",
        "arithmetic", "--skip", "up", "--skip", "limits", *[a for s in skip for a in ("--skip", s)],
        *[a for s in sets for a in ("--set", s)]])
    keep = ("steps_per_s", "step_s", "tokens_per_s", "peak_rss_gib", "stages")
    res = {side: {k: figures[side][k] for k in keep if k in figures[side]}
           for side in ("run", "trl") if side in figures}
    if "run" in res and "trl" in res:
        res["run_over_trl"] = res["run"]["steps_per_s"] / res["trl"]["steps_per_s"]
    return res


def _shape_dir(b: Bench, tmp: Path, shape: Path = SMOLLM2_SHAPE) -> Path:
    if b.dry:
        return _tiny_model_dir(tmp / "tiny")
    if not (shape / "config.json").is_file():
        raise RuntimeError(f"{shape} is missing: run `make gpu-wheels` here before the device call")
    return shape


def _bf16_flags() -> list[str]:
    """The host CPU's bf16 instructions (AVX512-BF16, AMX), from /proc/cpuinfo."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return sorted(set(line.split(":", 1)[1].split()) & {"avx512_bf16", "amx_bf16", "amx_tile"})
    return []


def cpu_bf16(b: Bench) -> dict:
    """Does this machine's CPU do bf16 (AVX512-BF16, AMX)? Then our fp32 and bf16-mixed steps and TRL's bf16
    step on it, SmolLM2's shape at 4 x 8 x 48 (issue #43's goals: bf16 >= 1.6x our fp32, >= 1.5x TRL's bf16)."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), None)
    out = {"cpu": model, "cores": os.cpu_count(), "bf16_flags": _bf16_flags()}
    if not out["bf16_flags"]:  # and a dry run (no such CPU here) leaves the path to vs_trl_cuda's
        out["skipped"] = "no bf16 instructions on this CPU"
        return out
    with tempfile.TemporaryDirectory() as tmp:
        shape = _shape_dir(b, Path(tmp))
        out["fp32"] = _vs_trl(b, shape, "cpu", "fp32", ["trl"])
        b.out["sections"]["cpu_bf16"] = {"status": "partial", **out}
        b.save()
        out["bf16"] = _vs_trl(b, shape, "cpu", "bf16", [])
    out["ours_bf16_over_fp32"] = out["bf16"]["run"]["steps_per_s"] / out["fp32"]["run"]["steps_per_s"]
    return out


def vs_trl_cuda(b: Bench) -> dict:
    """Ours against TRL's GRPOTrainer on the device, bf16 (TRL bf16=True) and fp32, SmolLM2's shape."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        shape = _shape_dir(b, Path(tmp))
        for dtype in ("bf16",) if b.dry else ("bf16", "fp32"):  # a dry run checks the path once
            out[dtype] = _vs_trl(b, shape, b.device, dtype, [])
            b.out["sections"]["vs_trl_cuda"] = {"status": "partial", **out}
            b.save()
    if "fp32" in out:
        out["ours_bf16_over_fp32"] = out["bf16"]["run"]["steps_per_s"] / out["fp32"]["run"]["steps_per_s"]
    return out


def sampling_copy(b: Bench) -> dict:
    """bf16-mixed with the engine sampling a bf16 copy of the weights (``weights.share_in_process: false``)
    instead of the learner's fp32 module under autocast: on a launch-bound decode autocast's casts are extra
    kernels. Ours only, on the device and, where it has bf16 instructions, on the host's CPU."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        shape = _shape_dir(b, Path(tmp))
        devices = [b.device] + (["cpu"] if b.device != "cpu" and _bf16_flags() else [])
        for device in devices:
            out[device] = _vs_trl(b, shape, device, "bf16", ["trl"], ("weights.share_in_process=false",))
            b.out["sections"]["sampling_copy"] = {"status": "partial", **out}
            b.save()
    return out


def pair_memory_bf16(b: Bench) -> dict:
    """Does the real pair fit in 16 GiB under `mutualrl up` where the CPU has bf16? (issue #43: on this project's
    AVX2 machines `model.dtype: auto` is fp32 and `up` peaked at 18.3 GiB.) benchmarks/bench_pair_memory.py on
    the host's CPU with SmolLM2's and Qwen2.5-Coder-0.5B's shapes (random weights: every row runs to 48 tokens),
    3 steps of examples/real/smollm2-qwen.yaml on our built-in sums: `up` in bf16-mixed, then in fp32, then `run`
    in bf16-mixed, as long as the budget lasts."""
    out: dict = {"bf16_flags": _bf16_flags()}
    if not out["bf16_flags"] and not b.dry:
        out["skipped"] = "no bf16 instructions on this CPU"
        return out
    with tempfile.TemporaryDirectory() as tmp:
        small = _shape_dir(b, Path(tmp))
        large = _shape_dir(b, Path(tmp), QWEN_CODER_SHAPE)
        size = ["--steps", "3"] if not b.dry else ["--steps", "1", "--set", "budget.prompts_per_step=2",
                                                   "--set", "budget.group_size=2", "--set", "budget.max_new_tokens=4"]
        runs = [("up", "bf16-mixed"), ("up", "float32"), ("run", "bf16-mixed")][: 1 if b.dry else 3]
        for mode, dtype in runs:
            if b.left_s() < 150 and not b.dry:
                out[f"{mode}_{dtype}"] = {"skipped": f"{b.left_s():.0f} s left"}
                continue
            fig = _benchmark_json(b, "bench_pair_memory.py", [
                *size, "--skip", "run" if mode == "up" else "up", "--task", "arithmetic",
                "--random-weights", f"smollm2={small}", "--random-weights", f"qwen-coder={large}",
                *[a for name in ("smollm2", "qwen-coder") for a in ("--set", f"policies.{name}.model.dtype={dtype}")]
            ])[mode]
            out[f"{mode}_{dtype}"] = {k: fig.get(k) for k in ("peak_rss_gib", "peak_anon_gib", "process_peak_gib",
                                                               "process_peak_anon_gib", "steps", "step_s", "policies")}
            b.out["sections"]["pair_memory_bf16"] = {"status": "partial", **out}
            b.save()
    return out


SECTIONS = [("env", env, 10), ("learner_step", learner_step, 90), ("logprob_memory", logprob_memory, 20),
            ("engine", engine, 40), ("weights_transport", weights_transport, 40), ("run_5_steps", run_5_steps, 60),
            ("run_real_shapes", run_real_shapes, 120), ("vs_trl_cuda", vs_trl_cuda, 90), ("cpu_bf16", cpu_bf16, 120),
            ("sampling_copy", sampling_copy, 60), ("pair_memory_bf16", pair_memory_bf16, 200)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="The CPU with tiny shapes (make test).")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "gpu" / "out" / "gpu.json")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--started", type=float, default=None, help="When the wrapper started (its install counts).")
    ap.add_argument("--micro-rows", type=int, default=None, help="learner_step's rows per micro-batch (16).")
    ap.add_argument("--only", action="append", default=[], help="Run only these sections.")
    args = ap.parse_args()
    b = Bench(args)
    for name, fn, need in SECTIONS:
        if not args.only or name in args.only:
            b.section(name, fn, need if not b.dry else 1)
    failed = [k for k, v in b.out["sections"].items() if v["status"] == "failed"]
    print(f"wrote {args.json}; failed: {', '.join(failed) or 'none'}")
    sys.exit(1 if failed and b.dry else 0)


if __name__ == "__main__":
    main()
