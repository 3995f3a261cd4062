"""CTranslate2 Whisper folder → transformers Whisper folder, so one set of weights runs on both
runtimes. Adapted from shared/reference/ct2read.py and ct2_to_hf_whisper.py.

CTranslate2 fuses the self-attention q/k/v into one matrix and the cross-attention k/v into
another; Whisper's k projection has no bias; the output projection is tied to the token
embeddings. ``converted_folder`` converts once into the cache, keyed by the source digest.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from pathlib import Path

import numpy as np

from taskrun.tasks.base import ModelCard, TaskError

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BF16 = 5


def read_ct2(path: str | Path) -> tuple[int, str, dict[str, np.ndarray], dict[str, str]]:
    """(format version, spec name, variables, aliases) of a CTranslate2 ``model.bin``.

    Arrays are copied out of a memory map, so the file is never read whole into memory.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        o = 0

        def u(fmt: str):
            nonlocal o
            v = struct.unpack_from(fmt, buf, o)[0]
            o += struct.calcsize(fmt)
            return v

        def s() -> str:
            nonlocal o
            n = u("H")
            v = bytes(buf[o : o + n - 1]).decode()
            o += n
            return v

        version = u("I")
        if version < 5:
            raise TaskError(
                f"{path} is CTranslate2 model format {version}; taskrun reads 5 and later. "
                f"Re-convert the model with a current ct2-transformers-converter"
            )
        name = s()
        u("I")  # spec revision
        out: dict[str, np.ndarray] = {}
        for _ in range(u("I")):
            key = s()
            shape = [u("I") for _ in range(u("B"))]
            dcode, nbytes = u("B"), u("I")
            raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=o).copy()
            o += nbytes
            if dcode == _BF16:  # bf16 is the top half of a float32
                arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif dcode in _DTYPES:
                arr = raw.view(_DTYPES[dcode])
            else:
                raise TaskError(f"{path}: unknown CTranslate2 dtype code {dcode}")
            out[key] = arr.reshape(shape)
        aliases = {}
        for _ in range(u("I")):
            alias = s()
            aliases[alias] = s()
    return version, name, out, aliases


def _weights(variables: dict[str, np.ndarray], aliases: dict[str, str]):
    """A getter for float32 torch tensors that follows aliases and undoes int8 quantisation."""
    import torch

    def get(key: str):
        key = aliases.get(key, key)
        arr = variables[key]
        scale = variables.get(key + "_scale")
        if arr.dtype in (np.int8, np.int16) and scale is not None:  # per-row scale: w = q / s
            arr = arr.astype(np.float32) / scale.astype(np.float32).reshape(-1, *([1] * (arr.ndim - 1)))
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))

    return get


def whisper_config(variables: dict[str, np.ndarray], ct2_config: dict):
    from transformers import WhisperConfig

    def count(side: str) -> int:
        return len({k.split("/")[1] for k in variables if re.match(side + r"/layer_\d+/", k)})

    vocab = variables["decoder/embeddings/weight"].shape[0]
    english = vocab == 51864  # the .en models drop the language tokens
    heads = int(np.asarray(variables["encoder/num_heads"]).reshape(-1)[0])
    ffn = variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    start, eos = (50257, 50256) if english else (50258, 50257)
    return WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=variables["encoder/conv1/weight"].shape[1],
        d_model=variables["encoder/conv1/weight"].shape[0],
        encoder_layers=count("encoder"),
        decoder_layers=count("decoder"),
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_source_positions=variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=variables["decoder/position_encodings/encodings"].shape[0],
        decoder_start_token_id=start,
        bos_token_id=start,
        eos_token_id=eos,
        pad_token_id=eos,
        begin_suppress_tokens=ct2_config.get("suppress_ids_begin"),
        suppress_tokens=ct2_config.get("suppress_ids"),
        tie_word_embeddings=True,
    )


def state_dict(variables: dict[str, np.ndarray], aliases: dict[str, str], cfg) -> dict:
    T = _weights(variables, aliases)
    sd = {}

    def attn(hf: str, ct: str, self_attention: bool) -> None:
        if self_attention:  # q, k, v fused in linear_0
            q, k, v = T(ct + "/linear_0/weight").chunk(3)
            bq, _, bv = T(ct + "/linear_0/bias").chunk(3)
            sd[hf + ".q_proj.bias"], sd[hf + ".v_proj.bias"] = bq, bv
            out = ct + "/linear_1"
        else:  # cross-attention: q in linear_0, k and v fused in linear_1
            q, bq = T(ct + "/linear_0/weight"), T(ct + "/linear_0/bias")
            k, v = T(ct + "/linear_1/weight").chunk(2)
            sd[hf + ".q_proj.bias"], sd[hf + ".v_proj.bias"] = bq, T(ct + "/linear_1/bias").chunk(2)[1]
            out = ct + "/linear_2"
        sd[hf + ".q_proj.weight"], sd[hf + ".k_proj.weight"], sd[hf + ".v_proj.weight"] = q, k, v
        sd[hf + ".out_proj.weight"], sd[hf + ".out_proj.bias"] = T(out + "/weight"), T(out + "/bias")

    def ln(hf: str, ct: str) -> None:
        sd[hf + ".weight"], sd[hf + ".bias"] = T(ct + "/gamma"), T(ct + "/beta")

    def ffn(hf: str, ct: str) -> None:
        sd[hf + ".fc1.weight"], sd[hf + ".fc1.bias"] = T(ct + "/linear_0/weight"), T(ct + "/linear_0/bias")
        sd[hf + ".fc2.weight"], sd[hf + ".fc2.bias"] = T(ct + "/linear_1/weight"), T(ct + "/linear_1/bias")
        ln(hf + ".final_layer_norm", ct + "/layer_norm")

    def stack(side: str, layers: int) -> None:  # "encoder" or "decoder": the same names on both sides
        sd[f"model.{side}.embed_positions.weight"] = T(f"{side}/position_encodings/encodings")
        ln(f"model.{side}.layer_norm", f"{side}/layer_norm")
        for i in range(layers):
            h, c = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            attn(h + ".self_attn", c + "/self_attention", True)
            ln(h + ".self_attn_layer_norm", c + "/self_attention/layer_norm")
            if side == "decoder":  # cross-attention over the encoder's output
                attn(h + ".encoder_attn", c + "/attention", False)
                ln(h + ".encoder_attn_layer_norm", c + "/attention/layer_norm")
            ffn(h, c + "/ffn")

    for c in ("conv1", "conv2"):
        sd[f"model.encoder.{c}.weight"], sd[f"model.encoder.{c}.bias"] = (
            T(f"encoder/{c}/weight"),
            T(f"encoder/{c}/bias"),
        )
    stack("encoder", cfg.encoder_layers)
    sd["model.decoder.embed_tokens.weight"] = T("decoder/embeddings/weight")
    stack("decoder", cfg.decoder_layers)
    return sd


def save_whisper_folder(
    model, tokenizer_file: str | Path, dst: str | Path, alignment_heads=None, lang_ids=None
) -> None:
    """Save a WhisperForConditionalGeneration with its processor and a generation config that
    knows the timestamp, language and task tokens (what generate(return_timestamps=True) needs)."""
    from transformers import (
        GenerationConfig,
        WhisperFeatureExtractor,
        WhisperProcessor,
        WhisperTokenizerFast,
    )

    cfg = model.config
    english = cfg.vocab_size == 51864
    tok = WhisperTokenizerFast(
        tokenizer_file=str(tokenizer_file),
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    proc = WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=cfg.num_mel_bins), tokenizer=tok)
    no_ts = tok.convert_tokens_to_ids("<|notimestamps|>")
    gc = GenerationConfig(
        decoder_start_token_id=cfg.decoder_start_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
        bos_token_id=cfg.bos_token_id,
        max_length=cfg.max_target_positions,
        begin_suppress_tokens=cfg.begin_suppress_tokens,
        suppress_tokens=cfg.suppress_tokens,
        no_timestamps_token_id=no_ts,
        prev_sot_token_id=tok.convert_tokens_to_ids("<|startofprev|>"),
        is_multilingual=not english,
        alignment_heads=alignment_heads,
        forced_decoder_ids=[[1, no_ts]] if english else None,
    )
    if not english:
        ids = lang_ids or range(50259, 50259 + 99)
        gc.lang_to_id = {tok.convert_ids_to_tokens(i): i for i in ids}
        gc.task_to_id = {
            "transcribe": tok.convert_tokens_to_ids("<|transcribe|>"),
            "translate": tok.convert_tokens_to_ids("<|translate|>"),
        }
    model.generation_config = gc
    model.save_pretrained(dst)
    proc.save_pretrained(dst)


def convert(src: str | Path, dst: str | Path) -> Path:
    """Convert the CTranslate2 Whisper folder ``src`` into a transformers folder ``dst``."""
    from transformers import WhisperForConditionalGeneration

    src, dst = Path(src), Path(dst)
    for need in ("model.bin", "config.json", "tokenizer.json"):
        if not (src / need).exists():
            raise TaskError(f"{src} lacks {need}; it is not a complete CTranslate2 Whisper folder")
    _, spec, variables, aliases = read_ct2(src / "model.bin")
    if "whisper" not in spec.lower():
        raise TaskError(f"{src} holds a CTranslate2 {spec}, not Whisper; only Whisper converts")
    ct2_config = json.loads((src / "config.json").read_text())
    cfg = whisper_config(variables, ct2_config)
    sd = state_dict(variables, aliases, cfg)
    del variables
    model = WhisperForConditionalGeneration(cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # The output projection is tied to the embeddings, so it is the only weight CT2 lacks.
    missing = [k for k in missing if k != "proj_out.weight"]
    if missing or unexpected:
        raise TaskError(f"converting {src} failed: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    lang_ids = ct2_config.get("lang_ids")
    if isinstance(lang_ids, str):
        lang_ids = json.loads(lang_ids)
    save_whisper_folder(model, src / "tokenizer.json", dst, ct2_config.get("alignment_heads"), lang_ids)
    limit = _source_max_length(src)
    if limit:  # keep a generation limit that the source folder carries
        model.generation_config.max_length = limit
        model.generation_config.save_pretrained(dst)
    return dst


def _source_max_length(src: Path) -> int | None:
    try:
        return json.loads((src / "generation_config.json").read_text()).get("max_length")
    except (OSError, ValueError):
        return None


def converted_folder(card: ModelCard, root: Path) -> Path:
    """The transformers copy of a CTranslate2 Whisper model, converted once under ``root`` and
    reused while the source digest is unchanged. Written to a temporary folder and renamed, so
    an interrupted conversion never leaves a half folder that looks finished; the folder is a
    self-checking cache entry (models/cache_entry.py): damaged, it is removed and converted again
    with one warning line, and temporary folders left by a killed conversion are cleaned here."""
    from taskrun.models import cache_entry

    key = card.digest.split(":")[-1][:16]

    def build(folder: Path) -> None:
        convert(card.path, folder)
        (folder / ".complete").write_text(card.digest + "\n")  # the marker older code and tests look for

    return cache_entry.build_once(root / "converted" / f"whisper-{key}", card, "the CTranslate2 model", build)
