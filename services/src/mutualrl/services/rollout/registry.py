"""The rollout engines, by the name a policy's ``engine.backend`` gives.

Registering an engine is adding its class here: the class declares its facts
(:data:`mutualrl.config.engines.ENGINES`), builds itself from a config (``from_config``) and probes a server
(``probe_config``); ``tests/integration/test_engine_contract.py`` runs every registered engine through the
same contract, and a test checks that this table, the facts and the config's literal name the same engines.
"""

from __future__ import annotations

from mutualrl.services.rollout.engine import RolloutEngine
from mutualrl.services.rollout.hf_engine import HFEngine
from mutualrl.services.rollout.http_engines import SGLangServerEngine, VLLMServerEngine

ENGINE_CLASSES: dict[str, type[RolloutEngine]] = {
    cls.facts.name: cls for cls in (HFEngine, VLLMServerEngine, SGLangServerEngine)
}


def engine_class(name: str) -> type[RolloutEngine]:
    """The engine class registered as ``name`` (a ValueError naming the registered ones for another)."""
    try:
        return ENGINE_CLASSES[name]
    except KeyError:
        raise ValueError(f"no rollout engine {name!r} is registered; registered: {', '.join(ENGINE_CLASSES)}") from None
