"""MLflow: a parent run per experiment run and a child run per policy, through ``MlflowClient``.

The parent holds the resolved config (parameters and ``config.yaml``), the tags and every policy's final
numbers; a child holds its policy's curves. Learners in separate processes find their parent by the
``mutualrl.group`` tag (the SEE namespace they share). MLflow has no create-if-absent, so when two create
one at once each keeps the earliest it sees (start time, then run id) and deletes its own if it lost. One
can still miss the other's earlier create, which reached the server after its check; so each learner looks
again at its first flush and at the end, by the same rule, moves its child under the winner and deletes
a parent of its own that lost: the runs end under one parent. A compare gives every run the compare's own
run as ``parent_run_id``, so its runs nest under it.
"""

from __future__ import annotations

import os
import threading
import time

from typing_extensions import override

from mutualrl.tracking.backend import Backend, RunInfo

PARAMS_PER_CALL = 100  # MLflow's log_batch limit on parameters
METRICS_PER_CALL = 1000
PARAM_VALUE_MAX = 6000
GROUP_TAG = "mutualrl.group"
ROLE_TAG = "mutualrl.role"

_parent_lock = threading.Lock()  # learners of an embedded run open their children at once


def _quiet_client_env() -> None:
    """MLflow's client retries a failed request for minutes by default; a tracker must fail fast (its
    points are buffered and retried by the guard), so cap it unless the user chose otherwise."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # the run's own display says where


def experiment_id(client, name: str) -> str:
    """The id of MLflow experiment ``name``, created if it does not exist (by whoever gets there first)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # another learner (or the compare) created it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


class MlflowBackend(Backend):
    """One policy's child run under its experiment run's parent."""

    name = "mlflow"

    def __init__(self, info: RunInfo, tracking_uri: str | None, experiment: str | None,
                 parent_run_id: str | None = None):
        _quiet_client_env()
        from mlflow import MlflowClient  # the mlflow (or mlflow-skinny) package: checked by the caller

        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise ValueError("no MLflow tracking URI: set tracking.mlflow.tracking_uri or MLFLOW_TRACKING_URI")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.info = info
        self.experiment_name = experiment or info.experiment
        self.outer_parent = parent_run_id
        self.experiment_id: str | None = None
        self.parent_id: str | None = None
        self.run_id: str | None = None
        self._own_parent: str | None = None  # the parent this learner created, while it may still lose
        self._settled = False  # looked again for an earlier parent since opening

    def _parents(self) -> list:
        query = f"tags.`{GROUP_TAG}` = '{self.info.group}' and tags.`{ROLE_TAG}` = 'experiment'"
        runs = self.client.search_runs([self.experiment_id], query, max_results=50)
        return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))

    def _parent(self) -> str:
        with _parent_lock:
            found = self._parents()
            if found:
                return found[0].info.run_id
            tags = {**self.info.tags, GROUP_TAG: self.info.group, ROLE_TAG: "experiment",
                    "mlflow.runName": self.info.tags.get("mlflow.runName", self.info.experiment)}
            tags.pop("policy", None)
            if self.outer_parent:
                tags["mlflow.parentRunId"] = self.outer_parent
            mine = self.client.create_run(self.experiment_id, tags=tags).info.run_id
            self._log_params(mine)
            if self.info.config_yaml:
                self.client.log_text(mine, self.info.config_yaml, "config.yaml")
            first = self._parents()[0].info.run_id  # another process may have made one at the same moment
            if first != mine:
                self.client.delete_run(mine)
            else:
                self._own_parent = mine
            return first

    def settle_parent(self) -> None:
        """Follow the parent the election settled on, in case this learner's check ran before another's
        earlier create reached the server (see the module's docstring)."""
        found = self._parents()
        if not found or found[0].info.run_id == self.parent_id:
            return
        lost, self.parent_id = self.parent_id, found[0].info.run_id
        self.client.set_tag(self.run_id, "mlflow.parentRunId", self.parent_id)
        if lost == self._own_parent:
            self.client.delete_run(lost)  # a child still under it follows at its own next look
            self._own_parent = None

    def _log_params(self, run_id: str) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], str(v)[:PARAM_VALUE_MAX]) for k, v in self.info.params.items()]
        for i in range(0, len(items), PARAMS_PER_CALL):
            self.client.log_batch(run_id, params=items[i:i + PARAMS_PER_CALL], synchronous=True)

    @override
    def open(self) -> None:
        if self.run_id is not None:
            return
        self.experiment_id = experiment_id(self.client, self.experiment_name)
        self.parent_id = self._parent()
        mine = self.client.search_runs(  # a restarted learner takes its policy's run up again
            [self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent_id}' and "
                                  f"tags.`{ROLE_TAG}` = 'policy' and tags.policy = '{self.info.policy}'", max_results=1)
        if mine:
            self.run_id = mine[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {**self.info.tags, GROUP_TAG: self.info.group, ROLE_TAG: "policy",
                "mlflow.parentRunId": self.parent_id, "mlflow.runName": self.info.policy}
        run_id = self.client.create_run(self.experiment_id, tags=tags).info.run_id
        self._log_params(run_id)
        self.run_id = run_id

    @override
    def log(self, step: int, values: dict[str, float]) -> None:
        self.log_many([(step, values)])

    @override
    def log_many(self, points: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        if not self._settled:
            self.settle_parent()
            self._settled = True
        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for step, values in points for k, v in values.items()]
        for i in range(0, len(items), METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=items[i:i + METRICS_PER_CALL], synchronous=True)

    @override
    def finish(self, summary: dict[str, float]) -> None:
        from mlflow.entities import Metric

        self.settle_parent()
        now = int(time.time() * 1000)
        if summary:
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, 0) for k, v in summary.items()])
            policy_keys = [Metric(f"{self.info.policy}/{k}", v, now, 0) for k, v in summary.items()]
            self.client.log_batch(self.parent_id, metrics=policy_keys)
        self.client.set_terminated(self.run_id, "FINISHED")
        running = self.client.search_runs(
            [self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent_id}' and attributes.status = 'RUNNING'",
            max_results=1)
        if not running:  # the last policy to finish closes its experiment's run
            self.client.set_terminated(self.parent_id, "FINISHED")

    def url(self) -> str | None:
        """The parent run's page, when the tracking URI is a server."""
        if self.parent_id and self.uri.startswith(("http://", "https://")):
            return f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.parent_id}"
        return None


def compare_run(tracking_uri: str | None, experiment: str, compare: str) -> tuple[str, str | None]:
    """The MLflow run a compare's runs nest under (found again when the compare resumes): its id, and its
    page when the tracking URI is a server. Raises when the server cannot be reached (the caller warns)."""
    _quiet_client_env()
    from mlflow import MlflowClient

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError("no MLflow tracking URI: set tracking.mlflow.tracking_uri or MLFLOW_TRACKING_URI")
    client = MlflowClient(tracking_uri=uri)
    exp_id = experiment_id(client, experiment)
    runs = client.search_runs([exp_id], f"tags.`{ROLE_TAG}` = 'compare' and tags.`mutualrl.compare` = '{compare}'",
                              max_results=1)
    run_id = runs[0].info.run_id if runs else client.create_run(
        exp_id, tags={ROLE_TAG: "compare", "mutualrl.compare": compare, "mlflow.runName": f"compare {compare}"}
    ).info.run_id
    url = f"{uri.rstrip('/')}/#/experiments/{exp_id}/runs/{run_id}" if uri.startswith(("http://", "https://")) else None
    return run_id, url
