"""The learner's optimiser: AdamW, with its two moment tensors kept in fp32 (torch's fused AdamW, the default) or
in bf16 with stochastic rounding (``optim.state_dtype: bfloat16``, docs/algorithms.md §7.4).

Why bf16 state: AdamW holds two fp32 moments per trained parameter, 8 bytes, twice the weights themselves. For
the 0.5B Qwen beside SmolLM2 under ``mutualrl up`` that is 4 GB of a 16 GiB budget. Kept in bf16 they take 4
bytes. The weights (the masters) stay fp32, so a 1e-5 update is not lost against a bf16 weight's spacing.

Why stochastic rounding: the second moment is an EMA, v ← β₂·v + (1 − β₂)·g², with β₂ = 0.999. Once v has
settled, each increment is about 10⁻³ of v, under half a bf16 spacing (2⁻⁹ of the value), and rounding to the
nearest value drops it every time: v freezes. Rounding up with probability equal to the remainder's share of
the spacing is unbiased (E[round(x)] = x), so the increments survive in expectation.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

STATE_DTYPES = ("float32", "bfloat16")
"""``optim.state_dtype``'s values (the config lists them without importing this library)."""

CHUNK = 1 << 22
"""Elements updated at once: a large tensor (an embedding table) is updated in slices of this many, so the fp32
working copies of its moments stay small (4 Mi elements: 16 MB each)."""


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``x`` (fp32) as bf16, rounded up or down at random in proportion to the distance (unbiased).

    bf16 is fp32's top 16 bits, so adding a uniform 16-bit integer to the bit pattern and keeping the top half
    carries into the kept bits with probability (low bits) / 2¹⁶; the bit patterns of negative numbers grow in
    magnitude the same way. A value bf16 represents exactly (low bits 0) never moves."""
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=x.device, generator=generator)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


def adamw_step_bf16_state(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                          step: int, *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                          generator: torch.Generator | None = None) -> None:
    """One AdamW update of ``param`` (fp32, in place) with its moments stored in bf16 (in place).

    As torch's AdamW (decoupled weight decay, Loshchilov & Hutter): θ ← θ·(1 − lr·λ) − lr·m̂ / (√v̂ + ε), with
    m ← β₁m + (1 − β₁)g, v ← β₂v + (1 − β₂)g², m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ), computed in fp32; the new
    m and v are stored stochastically rounded."""
    bc1 = 1 - beta1**step
    bc2_sqrt = (1 - beta2**step) ** 0.5
    flat_p, flat_g = param.view(-1), grad.reshape(-1)
    flat_m, flat_v = exp_avg.view(-1), exp_avg_sq.view(-1)
    for start in range(0, flat_p.numel(), CHUNK):
        sl = slice(start, start + CHUNK)
        g = flat_g[sl].float()
        m = flat_m[sl].float().lerp_(g, 1 - beta1)
        v = flat_v[sl].float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
        p = flat_p[sl]
        if weight_decay:
            p.mul_(1 - lr * weight_decay)
        p.addcdiv_(m, v.sqrt().div_(bc2_sqrt).add_(eps), value=-lr / bc1)
        flat_m[sl] = stochastic_round_bf16(m, generator)
        flat_v[sl] = stochastic_round_bf16(v, generator)


class AdamWBf16State(torch.optim.Optimizer):
    """AdamW whose moments are bf16 (``optim.state_dtype: bfloat16``): half the optimiser memory of torch's.

    Like the fused AdamW the learner uses otherwise, it takes ``found_inf``: set to a nonzero tensor, the next
    :meth:`step` changes nothing (neither weights, moments nor step counts). The rounding noise is drawn from a
    generator seeded by (``seed``, update number), so a resumed run rounds as the uninterrupted one would."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, seed: int = 0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.seed = seed
        self.found_inf: torch.Tensor | None = None
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device, update: int) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device)
        return gen.manual_seed(self.seed * 1_000_003 + update)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient, unless ``found_inf`` is set and nonzero."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.found_inf is not None and bool(self.found_inf.item()):
            return loss
        seeded: set[torch.device] = set()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.float32:
                    raise TypeError(f"optim.state_dtype bfloat16 keeps fp32 master weights; a parameter is {p.dtype}")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16,
                                                           memory_format=torch.contiguous_format)
                state["step"] += 1
                step = int(state["step"].item())
                if p.device not in seeded:  # one stream per device per update, drawn in parameter order
                    self._generator(p.device, step)
                    seeded.add(p.device)
                adamw_step_bf16_state(p, p.grad, state["exp_avg"], state["exp_avg_sq"], step, lr=group["lr"],
                                      beta1=beta1, beta2=beta2, eps=group["eps"],
                                      weight_decay=group["weight_decay"], generator=self._generators[p.device])
        return loss


def make_optimizer(params: list[torch.Tensor], *, lr: float, weight_decay: float, state_dtype: str = "float32",
                   seed: int = 0) -> torch.optim.Optimizer:
    """The learner's AdamW: torch's fused one (fp32 state), or :class:`AdamWBf16State` for ``bfloat16``."""
    if state_dtype == "bfloat16":
        return AdamWBf16State(params, lr=lr, weight_decay=weight_decay, seed=seed)
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"optim.state_dtype must be one of {STATE_DTYPES}, not {state_dtype!r}")
    # fused: the update of a mini-batch without learning signal is skipped on the device (``found_inf``), so the
    # host never waits for a gradient norm mid-step
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
