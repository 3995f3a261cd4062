"""GGUF files without a GGUF library: which file a model card points at, and its header.

Reading the header by hand takes milliseconds where gguf's GGUFReader maps and indexes every
tensor (seconds on a 100 MB file); resolution and `run fit` need the header only.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from taskrun.tasks.base import ModelCard, TaskError


def gguf_file(card: ModelCard) -> Path | None:
    """The GGUF file a card points at (the file itself, or the single one in its folder)."""
    p = Path(card.path)
    if p.is_file():
        return p if p.suffix == ".gguf" else None
    if p.is_dir() and not (p / "config.json").exists():
        found = sorted(p.glob("*.gguf"))
        return found[0] if found else None
    return None


def gguf_path(card: ModelCard) -> Path:
    """The GGUF file of a card that is one; a clear error for a card that is not."""
    path = gguf_file(card)
    if path is None:
        raise TaskError(f"{card.name} is not a GGUF model ({card.path}); give a .gguf file or a folder holding one")
    return path


_GGUF_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


def gguf_architecture(path: Path) -> str:
    arch = gguf_metadata(path).get("general.architecture")
    if not isinstance(arch, str):
        raise TaskError(f"{path} has no general.architecture in its GGUF header; is it a GGUF model?")
    return _GGUF_ARCH.get(arch, f"{arch}ForCausalLM")


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _read(f, fmt):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack(fmt, data)[0]


def _read_str(f):
    return f.read(_read(f, "<Q")).decode("utf-8", "replace")


def _skip_value(f, vtype):
    if vtype in _GGUF_SCALARS:
        f.seek(struct.calcsize(_GGUF_SCALARS[vtype]), 1)
    elif vtype == 8:
        f.seek(_read(f, "<Q"), 1)
    elif vtype == 9:
        etype, n = _read(f, "<I"), _read(f, "<Q")
        if etype in _GGUF_SCALARS:
            f.seek(n * struct.calcsize(_GGUF_SCALARS[etype]), 1)
        else:
            for _ in range(n):
                _skip_value(f, etype)
    else:
        raise ValueError(f"unknown GGUF value type {vtype}")


def _parameters(f, n_tensors: int) -> int:
    """The parameter count, from the tensor table that follows the header (name, dims, type, offset)."""
    total = 0
    for _ in range(n_tensors):
        _read_str(f)
        n = 1
        for _ in range(_read(f, "<I")):
            n *= _read(f, "<Q")
        f.seek(4 + 8, 1)
        total += n
    return total


_SEEN: dict[tuple, dict] = {}  # (path, tensors, size, mtime, inode, ctime) -> header, for this process
_SEEN_MAX = 32


def gguf_metadata(path: Path, tensors: bool = False) -> dict:
    """The header of a GGUF file (see _read_metadata), read once per version of the file in a
    process: a 151k-token vocabulary takes ~0.1-0.4 s to step over (the 1.5B default's), which
    every job on a warm server paid twice (resolve, then the engine's load) before."""
    try:
        st = os.stat(path)
    except OSError:
        return _read_metadata(path, tensors)  # it says what is wrong with the path
    key = (str(path), tensors, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
    if key not in _SEEN:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.pop(next(iter(_SEEN)))
        _SEEN[key] = _read_metadata(path, tensors)
    return dict(_SEEN[key])


def _read_metadata(path: Path, tensors: bool = False) -> dict:
    """The key/value header of a GGUF file (strings and numbers; arrays are skipped).

    gguf's GGUFReader maps and indexes every tensor, which takes seconds on a 100 MB file; the
    header alone is a few KB and is all that resolution and `run fit` need. ``tensors=True`` also
    reads the tensor table and adds the parameter count as ``taskrun.parameters``.
    """
    out: dict = {}
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("no GGUF magic")
            _read(f, "<I")  # version
            n_tensors = _read(f, "<Q")
            for _ in range(_read(f, "<Q")):
                key, vtype = _read_str(f), _read(f, "<I")
                if vtype in _GGUF_SCALARS:
                    out[key] = _read(f, _GGUF_SCALARS[vtype])
                elif vtype == 8:
                    out[key] = _read_str(f)
                else:
                    _skip_value(f, vtype)
            if tensors:
                out["taskrun.parameters"] = _parameters(f, n_tensors)
    except (OSError, EOFError, ValueError, struct.error) as exc:
        raise TaskError(f"{path} is not a readable GGUF file ({exc or 'truncated'}); re-download it") from None
    return out


# The llama.cpp engine's float16 prompt copy, sized here so `run fit` counts it without loading it.
COPY_MAX_BYTES = 256 << 20  # a prompt copy only for GGUFs up to this size (~0.5B parameters at 4 bits)
WIDE_FORMATS = {"f32", "f16", "bf16", "q8_0", "q6_k"}  # formats a prompt copy would not help


def file_type(meta: dict) -> str:
    """The GGUF's weight format as the run log records it: "q4_1", "q8_0", "f16", ..."""
    code = meta.get("general.file_type")
    if code is None:
        return "gguf"
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(int(code)).name
    except ValueError:
        return f"gguf-type-{code}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()


def wants_prompt_copy(path: Path, dtype: str) -> bool:
    """A small GGUF in a 4/5-bit format reads prompts from a float16 copy (TASKRUN_PROMPT_COPY=0: never)."""
    if os.environ.get("TASKRUN_PROMPT_COPY", "1") == "0" or dtype in WIDE_FORMATS or dtype.startswith("gguf"):
        return False
    return path.stat().st_size <= COPY_MAX_BYTES


def copy_bytes(path: Path) -> int:
    """The float16 copy's size, over-estimated a little: two bytes a parameter (from the GGUF's
    tensor table) plus 1%, plus room for the header (vocabulary, template: at most the file's size,
    counted as 8 MB at most); four times the file where the table cannot be read."""
    try:
        params = int(gguf_metadata(path, tensors=True).get("taskrun.parameters") or 0)
    except TaskError:
        params = 0
    size = path.stat().st_size
    return int(params * 2 * 1.01) + min(size, 8 << 20) if params else 4 * size
