"""A setup: what answers the cases. ``smollm2-135m@temperature=0,max_tokens=64`` (a local model
alias or path, with generate's options and ``runtime=``), ``openai:URL#model@...`` or
``ollama:URL#model@...`` (an endpoint), or a TOML setups file of ``[[setup]]`` tables::

    [[setup]]
    name = "hosted"
    endpoint = "openai:https://api.example.com/v1#some-model"
    api_key_env = "EXAMPLE_KEY"      # the NAME of the variable; never the key
    price_in = 0.15                  # $ per million input tokens
    price_out = 0.60                 # $ per million output tokens
    options = { max_tokens = 128 }

    [[setup]]
    name = "laptop"
    model = "smollm2-135m"
    price_hour = 0.05                # $ per hour of this machine: cost = time x rate
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from taskrun.tasks.base import TaskError

# generate's options a setup may set; the rest (the prompt, system, history) come from the case
OPTION_TYPES = {
    "stop": lambda v: (v,),  # one stop text
    "max_tokens": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "repeat_penalty": float,
}
SETUP_KEYS = {"name", "model", "endpoint", "runtime", "api_key_env", "price_in", "price_out", "price_hour", "options"}


@dataclass
class Setup:
    name: str
    model: str = ""  # a local alias or path
    endpoint: str = ""  # openai:URL#model | ollama:URL#model
    runtime: str | None = None
    api_key_env: str = ""
    options: dict = field(default_factory=dict)
    price_in: float = 0.0  # $ per million input tokens
    price_out: float = 0.0
    price_hour: float = 0.0  # $ per hour of the machine (local)

    def cost(self, input_tokens: int, output_tokens: int, seconds: float) -> float:
        return (input_tokens * self.price_in + output_tokens * self.price_out) / 1e6 + seconds * self.price_hour / 3600


def _options(text: str, where: str) -> dict:
    out: dict = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise TaskError(f"setup {where}: option {part!r} needs a value, e.g. temperature=0")
        out[key] = value.strip()
    return out


def _typed(opts: dict, where: str) -> tuple[dict, str | None, str]:
    runtime = opts.pop("runtime", None)
    key_env = opts.pop("api_key_env", "")
    unknown = sorted(set(opts) - set(OPTION_TYPES))
    if unknown:
        raise TaskError(
            f"setup {where}: unknown option {', '.join(unknown)}; known: runtime, api_key_env, {', '.join(OPTION_TYPES)}"
        )
    try:
        return {k: OPTION_TYPES[k](v) for k, v in opts.items()}, runtime, key_env
    except ValueError as exc:
        raise TaskError(f"setup {where}: {exc}") from None


def parse_setup(text: str) -> list[Setup]:
    """One --setup value → its setups (a TOML file gives several)."""
    if text.endswith(".toml"):
        return load_setups(text)
    head, text_opts = text, ""
    at = text.rfind("@")
    if at > text.find("#"):  # an @ after the model part starts options (URLs with user@ are refused)
        head, text_opts = text[:at], text[at + 1 :]
    opts, runtime, key_env = _typed(_options(text_opts, text), head)
    if head.startswith(("openai:", "ollama:", "http://", "https://")):
        from taskrun.pipelines.llm.endpoint_client import parse_spec, safe_url

        api, url, model = parse_spec(head)
        if "@" in url.split("//", 1)[-1]:
            raise TaskError(f"setup {safe_url(url)}: no credentials in the URL; name a variable with api_key_env=VAR")
        return [Setup(name=text, endpoint=f"{api}:{url}#{model}", api_key_env=key_env, options=opts)]
    return [Setup(name=text, model=head, runtime=runtime, options=opts)]


def load_setups(path: str) -> list[Setup]:
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"--setup {path}: no such setups file")
    try:
        tables = tomllib.loads(p.read_text(encoding="utf-8")).get("setup", [])
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{path}: not valid TOML ({exc})") from None
    if not tables:
        raise TaskError(f"{path}: no [[setup]] tables")
    out = []
    for i, t in enumerate(tables, 1):
        where = f"{path} setup {i}"
        unknown = sorted(set(t) - SETUP_KEYS)
        if unknown:
            raise TaskError(f"{where}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(SETUP_KEYS))}")
        if bool(t.get("model")) == bool(t.get("endpoint")):
            raise TaskError(f"{where}: give one of model = ... or endpoint = ...")
        opts, runtime, key_env = _typed({k: str(v) for k, v in (t.get("options") or {}).items()}, where)
        s = parse_setup(t.get("endpoint") or t["model"])[0]
        s.name = t.get("name") or s.name
        s.options = {**s.options, **opts}
        s.runtime = t.get("runtime") or runtime or s.runtime
        s.api_key_env = t.get("api_key_env") or key_env or s.api_key_env
        for k in ("price_in", "price_out", "price_hour"):
            value = float(t.get(k, 0))
            if value < 0:
                raise TaskError(f"{where}: {k} must be 0 or more")
            setattr(s, k, value)
        out.append(s)
    return out
