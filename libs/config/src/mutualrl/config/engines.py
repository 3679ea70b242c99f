"""What each rollout engine is, as the rest of the house needs to know it: plain facts, one entry per engine.

Code that treats engines differently (the config's checks, the weight groups, the launchers, the learner's
behaviour correction, the Kubernetes objects) asks these facts instead of testing an engine's name, so a new
engine is one entry here, one class registered in ``mutualrl.services.rollout.registry`` that declares these
facts, and a run of ``tests/integration/test_engine_contract.py`` (docs/architecture.md, "Where to add an
engine"). The config's ``engine.backend`` literal is checked against this table by a test.

The facts live at the bottom floor (config) because the config itself and the weights library consult them;
the engine classes, one floor up, point at their entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

WeightGroup = Literal["per_version", "torch_group", "vllm_nccl"]


@dataclass(frozen=True)
class ServerFacts:
    """How a server engine is started beside a rollout service (the Kubernetes sidecar): its image, the
    command (empty: the image's entrypoint), the flags naming the model and the tensor-parallel size, the
    flags the rollout adapter relies on (weight reload, metrics), and environment it needs."""
    image: str
    command: tuple[str, ...] = ()
    model_flag: str = "--model"
    tp_flag: str = "--tensor-parallel-size"
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def argv(self, model: str, tp: int, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
        """The server's arguments: the model, port 8000, tensor parallelism, the engine's own flags, ``extra``."""
        return [self.model_flag, model, "--port", "8000", self.tp_flag, str(tp), *self.flags, *extra]


@dataclass(frozen=True)
class EngineFacts:
    """One engine's facts.

    - ``in_process``: it runs inside the rollout (or embedded) process on the policy's own model; otherwise it
      is a server reached at ``engine.url``, which reads weights from a directory or joins a weight group, and
      which a Kubernetes rollout pod runs as a sidecar.
    - ``learner_numbers``: at fp32 it computes the learner's log-probs (the same module and kernels), so no
      behaviour correction is needed; a server's kernels differ, so the learner corrects for the gap.
    - ``weight_deltas``: it can apply a version as the changes since the one before.
    - ``collective_backends``: the process-group backends it can take a broadcast over (a vLLM server:
      NCCL only); ``gpu``: it always runs on a GPU (so ``weights.backend: auto`` picks NCCL).
    - ``weight_group``: how it joins the learner's weight group: a fresh group per version (``per_version``),
      once through the server's route into a torch group (``torch_group``), or through vLLM's own NCCL
      communicator (``vllm_nccl``).
    """
    name: str
    in_process: bool
    learner_numbers: bool
    weight_deltas: bool
    collective_backends: tuple[str, ...]
    gpu: bool
    weight_group: WeightGroup
    server: ServerFacts | None = field(default=None)


ENGINES: dict[str, EngineFacts] = {
    "hf": EngineFacts("hf", in_process=True, learner_numbers=True, weight_deltas=True,
                      collective_backends=("gloo", "nccl"), gpu=False, weight_group="per_version"),
    "vllm": EngineFacts("vllm", in_process=False, learner_numbers=False, weight_deltas=False,
                        collective_backends=("nccl",), gpu=True, weight_group="vllm_nccl",
                        server=ServerFacts("vllm/vllm-openai:v0.10.2", flags=("--enable-sleep-mode",),
                                           env=(("VLLM_SERVER_DEV_MODE", "1"),))),  # vLLM serves /metrics itself
    "sglang": EngineFacts("sglang", in_process=False, learner_numbers=False, weight_deltas=False,
                          collective_backends=("gloo", "nccl"), gpu=True, weight_group="torch_group",
                          server=ServerFacts("lmsysorg/sglang:v0.5.2", command=("python3", "-m",
                                                                               "sglang.launch_server"),
                                             model_flag="--model-path", tp_flag="--tp-size",
                                             flags=("--enable-memory-saver", "--enable-metrics"))),
}


def engine_facts(name: str) -> EngineFacts:
    """The facts of engine ``name`` (a ValueError naming the known engines for another)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown rollout engine {name!r}; known: {', '.join(ENGINES)}") from None


def server_engines() -> tuple[str, ...]:
    """The engines that run as servers (reached at ``engine.url``)."""
    return tuple(n for n, f in ENGINES.items() if not f.in_process)
