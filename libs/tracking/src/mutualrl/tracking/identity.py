"""What a tracked run is called and labelled: the tags and parameters every backend gets for one policy,
from the resolved experiment (the same whether it runs embedded, under `up`, compose or Helm)."""

from __future__ import annotations

import os
import subprocess
import uuid
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from mutualrl.config import ExperimentConfig
from mutualrl.tracking.backend import RunInfo
from mutualrl.tracking.points import params


@lru_cache(maxsize=1)
def project_version() -> tuple[str, str]:
    """mutualrl's version and commit: ``MUTUALRL_COMMIT`` (the image sets it), else ``git`` beside the
    source, else "unknown"."""
    try:
        ver = version("mutualrl")
    except PackageNotFoundError:
        ver = "unknown"
    commit = os.environ.get("MUTUALRL_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent,
                                    capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
    return ver, commit or "unknown"


def new_group() -> str:
    """A fresh id that ties an embedded run's policies together in a tracker."""
    return uuid.uuid4().hex[:12]


def run_info(cfg: ExperimentConfig, policy: str, group: str, run_dir: Path) -> RunInfo:
    """One policy's :class:`RunInfo`: tags experiment, policy, model, tokenizer, sharing (as this policy
    receives it), seed, version and commit, plus ``tracking.tags``; the resolved config as parameters."""
    p = next(x for x in cfg.policies if x.name == policy)
    ver, commit = project_version()
    sharing = cfg.sharing.describe()
    tags = {"experiment": cfg.name, "policy": policy,
            "model": p.model.path or p.model.family or "unknown",
            "tokenizer": p.tokenizer.path or p.tokenizer.kind or "unknown",
            "sharing": sharing, "seed": str(cfg.seed), "mutualrl.version": ver, "mutualrl.commit": commit,
            **cfg.tracking.tags}
    resolved = cfg.model_dump(mode="json", by_alias=True)
    return RunInfo(experiment=cfg.name, policy=policy, group=group, run_dir=run_dir, tags=tags,
                   params=params(resolved), config_yaml=yaml.safe_dump(resolved, sort_keys=False))
