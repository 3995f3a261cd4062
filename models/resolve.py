"""Model resolution: an alias, a local folder or file, or a hub id → a ModelCard.

Nothing here imports torch or reads weights (digests read bytes, once, then are cached), so
`run models`, `run tasks` and every task's ``check`` stay fast and run before loading.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from taskrun.models.digest import digest_path, dir_size
from taskrun.models.gguf import gguf_architecture
from taskrun.models.provenance import describe, packages
from taskrun.tasks.base import ModelCard, TaskError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def config_path() -> Path:
    return Path(os.environ.get("TASKRUN_MODELS_TOML", CONFIG_DIR / "models.toml"))


@lru_cache(maxsize=4)
def _load_config(path: str) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def load_config() -> dict:
    return _load_config(str(config_path()))


def cache_dir() -> Path:
    """Where taskrun keeps converted weights, digests and corpus vectors."""
    env = os.environ.get("TASKRUN_CACHE_DIR")
    if env:
        d = Path(env)
    else:
        import platformdirs

        d = Path(platformdirs.user_cache_dir("taskrun"))
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:  # a cache that cannot be made: each use says so (runner/output/paths.py warns first)
        pass
    return d


def default_model(task: str, input_kind: str | None = None) -> str:
    defaults = load_config().get("defaults", {})
    if input_kind and f"{task}:{input_kind}" in defaults:
        return defaults[f"{task}:{input_kind}"]
    if task in defaults:
        return defaults[task]
    raise TaskError(f"no default model for {task}; give one with --model")


def aliases() -> dict[str, dict]:
    return load_config().get("models", {})


def task_catalogue() -> list[dict]:
    """What `run tasks --json` (and ``taskrun.tasks()``) lists: each task's description, its
    default models and where they come from."""
    from taskrun.tasks import REGISTRY

    defaults = load_config().get("defaults", {})
    rows = []
    for name, task in REGISTRY.items():
        d = task.describe()
        d["default_models"] = {k: v for k, v in defaults.items() if k == name or k.startswith(name + ":")}
        d["default_sources"] = {
            v: aliases().get(v, {}).get("pip") or aliases().get(v, {}).get("hub", "")
            for v in d["default_models"].values()
        }
        rows.append(d)
    return rows


# --------------------------------------------------------------------------- architectures


@dataclass(frozen=True)
class ArchRule:
    pattern: str  # regex matched against the architecture name
    tasks: tuple[str, ...]
    kind: str
    runtimes: tuple[str, ...]


# First match wins. A pipeline module adds its rule here when it adds a task.
ARCH_RULES: list[ArchRule] = [
    ArchRule(r"ForSequenceClassification$", ("classify",), "text-classification", ("transformers",)),
    ArchRule(r"ForImageClassification$", ("classify",), "image-classification", ("transformers",)),
    ArchRule(r"ForObjectDetection$", ("detect",), "object-detection", ("transformers",)),
    ArchRule(
        r"^(Bert|MPNet|XLMRoberta|Roberta|DistilBert|NomicBert|E5|Electra)Model$|SentenceTransformer",
        ("embed", "search", "classify"),
        "sentence-embedding",
        ("transformers",),
    ),
    ArchRule(r"ForCausalLM$|LMHeadModel$", ("generate", "summarize"), "text-generation", ("transformers",)),
    # A CTranslate2 Whisper folder runs on faster-whisper, or on transformers after a one-time conversion.
    ArchRule(r"^WhisperCT2$", ("transcribe",), "speech-recognition", ("ctranslate2", "transformers")),
    ArchRule(r"^WhisperForConditionalGeneration$|ForCTC$", ("transcribe",), "speech-recognition", ("transformers",)),
    # diffusers folders: model_index.json names the pipeline class (StableDiffusionPipeline,
    # DDPMPipeline, …); a bare UNet2DModel folder is a pixel-space diffusion model.
    ArchRule(r"Pipeline$|^UNet2DModel$", ("image",), "image-generation", ("diffusers",)),
]


def rule_for(architecture: str) -> ArchRule | None:
    for rule in ARCH_RULES:
        if re.search(rule.pattern, architecture):
            return rule
    return None


def read_architecture(path: Path, entry: dict) -> str:
    """The architecture named by a model's own files (or its models.toml entry)."""
    if entry.get("architecture"):
        return entry["architecture"]
    if path.is_file():
        if path.suffix == ".gguf":
            return gguf_architecture(path)
        return path.suffix.lstrip(".") or "unknown"
    for name in ("model_index.json", "config.json"):
        f = path / name
        if f.exists():
            try:
                cfg = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise TaskError(
                    f"{f} is not valid JSON ({exc}); the model folder looks corrupt: re-download or re-install it"
                ) from None
            if cfg.get("_class_name"):
                return cfg["_class_name"]
            if cfg.get("architectures"):
                return cfg["architectures"][0]
            if (
                (path / "model.bin").exists()
                and (path / "vocabulary.txt").exists()
                or (path / "model.bin").exists()
                and "alignment_heads" in cfg
            ):
                return "WhisperCT2"
            if cfg.get("model_type"):
                return cfg["model_type"]
    ggufs = list(path.glob("*.gguf"))
    if ggufs:
        return gguf_architecture(ggufs[0])
    if (path / "model.bin").exists():
        return "WhisperCT2"
    raise TaskError(
        f"{path} has no config.json or model_index.json; taskrun cannot tell what "
        f"model it is. Point --model at a Hugging Face or diffusers folder, a GGUF "
        f"file or a CTranslate2 folder"
    )


# --------------------------------------------------------------------------- sources


def _package_path(entry: dict) -> Path | None:
    """The entry's folder or file inside an installed package, found without importing it."""
    pkg = entry.get("package")
    if not pkg:
        return None
    try:
        spec = importlib.util.find_spec(pkg)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    return root / entry["path"] if entry.get("path") else root


def _joined(entry: dict, name: str) -> Path | None:
    """Split weights (``join`` = list of package:path parts) joined once into the cache (models/join.py)."""
    from taskrun.models.join import joined

    return joined(entry, name, cache_dir(), _package_path)


def is_offline(offline: bool = False) -> bool:
    return (
        offline
        or os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "True")
        or os.environ.get("TASKRUN_OFFLINE", "") in ("1", "true")
    )


def _hub_path(repo: str, revision: str | None, offline: bool) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise TaskError("hub models need huggingface_hub: pip install huggingface_hub") from None
    where = f"{repo}@{revision}" if revision else repo
    try:
        return Path(snapshot_download(repo, revision=revision, local_files_only=is_offline(offline), etag_timeout=5))
    except Exception as exc:  # the hub raises many kinds; all mean the same to the user
        if is_offline(offline):
            raise TaskError(
                f"{where} is not in the local Hugging Face cache and offline mode forbids "
                f"downloading; download it where there is network (`hf download {repo}`) "
                f"or point --model at a local folder"
            ) from None
        raise TaskError(
            f"could not fetch {where} from the hub ({type(exc).__name__}); check the "
            f"network, or point --model at a local folder, or use --offline"
        ) from None


def locate(name: str, offline: bool = False) -> tuple[Path, dict, str]:
    """(path, models.toml entry, source description) for an alias, a path or a hub id."""
    entry = aliases().get(name)
    if entry is not None:
        if entry.get("join"):
            p = _joined(entry, name)
            if p is not None:
                return p, entry, "packages " + packages(entry.get("pip", ""))
        p = _package_path(entry)
        if p is not None and p.exists():
            target = p / entry["file"] if entry.get("file") else p
            where = (
                f"package {entry['pip']}"
                if entry.get("pip")
                else f"bundled with taskrun ({entry['package']}/{entry.get('path', '')})"
            )
            return target, entry, where
        if entry.get("local"):
            p = Path(entry["local"])
            if not p.is_absolute():
                p = CONFIG_DIR.parent / p
            if p.exists():
                return p, entry, "local folder"
        if entry.get("hub"):
            if is_offline(offline) and entry.get("pip"):
                raise TaskError(
                    f"`{name}` is not installed here; install it with "
                    f"`pip install {entry['pip']}` (offline mode forbids the hub)"
                )
            return (
                _hub_path(entry["hub"], entry.get("revision"), offline),
                entry,
                f"hub {entry['hub']}@{entry.get('revision', 'main')}",
            )
        hint = f"`pip install {entry['pip']}`" if entry.get("pip") else "see configs/models.toml"
        raise TaskError(f"`{name}` is not available here; install it with {hint}")
    p = Path(name).expanduser()
    if p.exists():
        return p.resolve(), {}, "local file" if p.is_file() else "local folder"
    if re.fullmatch(r"[\w.-]+/[\w.-]+(@[\w.-]+)?", name):
        repo, _, rev = name.partition("@")
        return _hub_path(repo, rev or None, offline), {}, f"hub {name}"
    known = ", ".join(aliases())
    raise TaskError(f"no model named '{name}': not an alias ({known}), not an existing path, not a hub id (org/name)")


def weights_format(path: Path, architecture: str) -> str:
    """The file format of a model's weights: gguf, ct2 (CTranslate2), safetensors, bin or pth.

    Engines take formats, not architectures: a Whisper in CTranslate2 format runs on faster-whisper
    (and on transformers after a conversion), a GGUF on whatever reads GGUF."""
    if architecture == "WhisperCT2":
        return "ct2"
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    suffixes = {f.suffix for f in files}
    for suffix, fmt in (
        (".gguf", "gguf"),
        (".safetensors", "safetensors"),
        (".bin", "bin"),
        (".pth", "pth"),
        (".pt", "pth"),
    ):
        if suffix in suffixes:
            return fmt
    return "unknown"


def resolve(name: str, offline: bool = False) -> ModelCard:
    """A ModelCard for ``name``: located, architecture read, tasks known, digest computed (cached)."""
    path, entry, source = locate(name, offline)
    arch = read_architecture(path, entry)
    rule = rule_for(arch)
    tasks = tuple(entry.get("tasks") or (rule.tasks if rule else ()))
    runtimes = tuple(entry.get("runtimes") or (rule.runtimes if rule else ("transformers",)))
    kind = entry.get("kind") or (rule.kind if rule else "")
    fmt = weights_format(path, arch)
    if not entry.get("runtimes"):
        runtimes = gguf_runtimes(runtimes, fmt, kind)
    runtime = entry.get("runtime") or runtimes[0]
    return ModelCard(
        name=name,
        path=str(path),
        architecture=arch,
        tasks=tasks,
        runtime=runtime,
        runtimes=runtimes,
        size_bytes=dir_size(path),
        digest=digest_path(path, cache_dir()),
        source=source,
        kind=kind,
        extra=dict(entry.get("settings", {})) | ({"draft": str(entry["draft"])} if entry.get("draft") else {}),
        format=fmt,
    )


def gguf_runtimes(runtimes: tuple[str, ...], fmt: str, kind: str) -> tuple[str, ...]:
    """A GGUF language model runs first on llama.cpp where llama-cpp-python is installed: it reads
    the quantised weights as stored (first run ~2 s beyond the torch import, decode 2.9x and TTFT
    0.15x the transformers engine's on SmolLM2 Q4_1; benchmarks/bench_generate.py), where
    transformers first converts the file. Without llama-cpp-python it runs on transformers."""
    if fmt != "gguf" or kind != "text-generation" or "llama.cpp" in runtimes:
        return runtimes
    return ("llama.cpp", *runtimes) if importlib.util.find_spec("llama_cpp") is not None else runtimes


def list_models(offline: bool = True) -> list[dict]:
    """Every alias in models.toml: available here or not, and why."""
    rows = []
    defaults = load_config().get("defaults", {})
    for name, entry in aliases().items():
        row = {
            "name": name,
            "description": entry.get("description", ""),
            "default_for": [t for t, m in defaults.items() if m == name],
        }
        try:
            card = resolve(name, offline=offline)
        except TaskError as exc:
            row.update(available=False, why=str(exc), **describe(entry, None))
        else:
            row.update(describe(entry, card.path))
            row.update(
                available=True,
                path=card.path,
                size_bytes=card.size_bytes,
                digest=card.digest,
                runtime=card.runtime,
                runtimes=list(card.runtimes),
                tasks=list(card.tasks),
                architecture=card.architecture,
                source=card.source,
                format=card.format,
            )
        rows.append(row)
    return rows
