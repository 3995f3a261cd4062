"""GGUF files without a GGUF library: which file a model card points at, and its header.

Reading the header by hand takes milliseconds where gguf's GGUFReader maps and indexes every
tensor (seconds on a 100 MB file); resolution and `run fit` need the header only.
"""

from __future__ import annotations

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


_GGUF_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
              "gemma": "GemmaForCausalLM", "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel"}


def gguf_architecture(path: Path) -> str:
    arch = gguf_metadata(path).get("general.architecture")
    if not isinstance(arch, str):
        raise TaskError(f"{path} has no general.architecture in its GGUF header; is it a GGUF model?")
    return _GGUF_ARCH.get(arch, f"{arch}ForCausalLM")


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}


def gguf_metadata(path: Path, tensors: bool = False) -> dict:
    """The key/value header of a GGUF file (strings and numbers; arrays are skipped).

    gguf's GGUFReader maps and indexes every tensor, which takes seconds on a 100 MB file; the
    header alone is a few KB and is all that resolution and `run fit` need. ``tensors=True`` also
    reads the tensor table and adds the parameter count as ``taskrun.parameters``.
    """
    def read(f, fmt):
        size = struct.calcsize(fmt)
        data = f.read(size)
        if len(data) != size:
            raise EOFError
        return struct.unpack(fmt, data)[0]

    def read_str(f):
        return f.read(read(f, "<Q")).decode("utf-8", "replace")

    def skip_value(f, vtype):
        if vtype in _GGUF_SCALARS:
            f.seek(struct.calcsize(_GGUF_SCALARS[vtype]), 1)
        elif vtype == 8:
            f.seek(read(f, "<Q"), 1)
        elif vtype == 9:
            etype, n = read(f, "<I"), read(f, "<Q")
            if etype in _GGUF_SCALARS:
                f.seek(n * struct.calcsize(_GGUF_SCALARS[etype]), 1)
            else:
                for _ in range(n):
                    skip_value(f, etype)
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")

    out: dict = {}
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("no GGUF magic")
            read(f, "<I")  # version
            n_tensors = read(f, "<Q")
            for _ in range(read(f, "<Q")):
                key, vtype = read_str(f), read(f, "<I")
                if vtype in _GGUF_SCALARS:
                    out[key] = read(f, _GGUF_SCALARS[vtype])
                elif vtype == 8:
                    out[key] = read_str(f)
                else:
                    skip_value(f, vtype)
            if tensors:  # the tensor table follows: name, dims, type, offset for each
                total = 0
                for _ in range(n_tensors):
                    read_str(f)
                    n = 1
                    for _ in range(read(f, "<I")):
                        n *= read(f, "<Q")
                    f.seek(4 + 8, 1)
                    total += n
                out["taskrun.parameters"] = total
    except (OSError, EOFError, ValueError, struct.error) as exc:
        raise TaskError(f"{path} is not a readable GGUF file ({exc or 'truncated'}); re-download it") from None
    return out
