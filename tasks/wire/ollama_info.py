"""Ollama's informational answers from the server's catalogue rows: /api/show, /api/ps, /api/version,
and the clear refusals of /api/pull and /api/delete (a taskrun server serves a local catalogue).
Torch- and web-framework-free.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from taskrun.tasks.wire import tools as tool_calls
from taskrun.tasks.wire.errors import APIError, invalid

# The Ollama API version this server answers like (the ollama client pinned in the tests speaks it)
OLLAMA_API_VERSION = "0.6.3"
NEVER = "2318-11-04T23:59:59Z"  # Ollama's expires_at for a model kept loaded (keep_alive -1)
CAPABILITIES = {"generate": "completion", "chat": "completion", "embed": "embedding"}


def find(rows: list[dict], body: dict) -> dict:
    """The catalogue row ``body["model"]`` (or Ollama's older ``name``) names; 404 in Ollama's words."""
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("model", "'model' must name a model (GET /api/tags lists them)")
    bare = name.removesuffix(":latest")
    row = next((r for r in rows if r["name"] in (name, bare)), None)
    if row is None:
        raise APIError(404, f"model '{name}' not found", param="model", code="model_not_found")
    return row


def details(row: dict) -> dict:
    return {
        "parent_model": "",
        "format": row.get("format", ""),
        "family": row.get("architecture", ""),
        "families": [row.get("architecture", "")],
        # `run models`' columns (models.toml's keys, else the GGUF header): models/provenance.py
        "parameter_size": row.get("parameters", ""),
        "quantization_level": row.get("quantisation", ""),
    }


def show_body(row: dict, chat: dict | None = None) -> dict:
    """``chat``: the model's ``family``, chat ``template`` and ``context_length`` where it has
    them (models/chat_info.py). ``template`` is a Go template, as Ollama's is (go_template); the
    model's own Jinja one is ``model_info["tokenizer.chat_template"]``, a GGUF's key for it."""
    caps = sorted({CAPABILITIES[t] for t in row["tasks"] if t in CAPABILITIES})
    chat = chat or {}
    model_info: dict = {"general.architecture": chat.get("family") or row.get("architecture", "")}
    if chat.get("context_length"):
        model_info[f"{model_info['general.architecture']}.context_length"] = chat["context_length"]
    if chat.get("template"):
        model_info["tokenizer.chat_template"] = chat["template"]
    template = go_template(chat.get("template", ""))
    if "completion" in caps and ".Tools" in template:  # as Ollama: a template that renders tools
        caps.append("tools")
    return {
        "modelfile": f"FROM {row['name']}\n",
        "parameters": "",
        "template": template,
        "details": details(row),
        "model_info": model_info,
        "capabilities": caps,
        "modified_at": datetime.fromtimestamp(row.get("created", 0), timezone.utc).isoformat().replace("+00:00", "Z"),
    }


def ps_body(rows: list[dict], loaded: set[str]) -> dict:
    """The models loaded now (``loaded``: their weights' digests)."""
    models = []
    for r in rows:
        if r["digest"] in loaded:
            models.append(
                {
                    "name": r["name"],
                    "model": r["name"],
                    "size": r["size_bytes"],
                    "digest": r["digest"].removeprefix("sha256:"),
                    "details": details(r),
                    "expires_at": NEVER,
                    "size_vram": 0,
                }
            )
    return {"models": models}


def pull_refused(body: dict, rows: list[dict]) -> APIError:
    name = body.get("model") or body.get("name") or ""
    here = any(r["name"] in (name, str(name).removesuffix(":latest")) for r in rows)
    if here:
        why = f"model '{name}' is already on this server (GET /api/tags lists it); nothing to pull"
    else:
        why = (
            f"this server does not download models: '{name}' must be installed on the server's machine "
            "(its catalogue is GET /api/tags)"
        )
    return APIError(400, why, param="model")


def delete_refused(body: dict) -> APIError:
    name = body.get("model") or body.get("name") or ""
    return APIError(400, f"this server does not delete models: remove '{name}' on the server's machine", param="model")


# --------------------------------------------------------------------------- /api/show's template
# Ollama answers a Go text/template over .System, .Messages and .Tools; clients read it for what the
# model can do (litellm's ollama/ provider: "tools" in it means the model calls tools). Here it is
# the prompt as taskrun renders it: the model's chat format (told apart by its Jinja template's
# markers) around tasks/wire/tools.py's Hermes tool format, which the system prompt carries.


def _system(root: str) -> str:
    """The system text: the tools' block, then the system messages (tools.ToolRequest.system);
    ``root`` is "." at the template's top, "$." inside a range."""
    lines = f"{{{{ range $i, $t := {root}Tools }}}}{{{{ if $i }}}}\n{{{{ end }}}}{{{{ json $t }}}}{{{{ end }}}}"
    tools = tool_calls.SYSTEM.format(tools=lines)
    return (
        f"{{{{ if {root}Tools }}}}{tools}{{{{ if {root}System }}}}\n\n{{{{ end }}}}{{{{ end }}}}{{{{ {root}System }}}}"
    )


def _turns(user: str, assistant: str, end: str, first_user: str = "") -> str:
    """The conversation's turns in a chat format (``user`` and ``assistant`` open a turn, ``end``
    closes one), as tasks/wire/tools.py rewrites them: an assistant's calls as <tool_call> lines,
    tool results as one user turn of <tool_response> blocks. System messages are in .System."""
    close = f'{{{{ if eq $prev "tool" }}}}{end}{{{{ end }}}}'
    calls = (
        "{{ range $j, $c := $m.ToolCalls }}{{ if or $j $m.Content }}\n{{ end }}<tool_call>\n"
        '{"name": "{{ $c.Function.Name }}", "arguments": {{ json $c.Function.Arguments }}}\n</tool_call>{{ end }}'
    )
    return (
        "{{ range $i, $m := .Messages }}"
        f'{{{{ if eq $m.Role "user" }}}}{close}{user}{first_user}{{{{ $m.Content }}}}{end}'
        f'{{{{ else if eq $m.Role "assistant" }}}}{close}{assistant}{{{{ $m.Content }}}}{calls}{end}'
        f'{{{{ else if eq $m.Role "tool" }}}}{{{{ if ne $prev "tool" }}}}{user}{{{{ else }}}}\n{{{{ end }}}}'
        "<tool_response>\n{{ $m.Content }}\n</tool_response>{{ end }}"
        '{{ if ne $m.Role "system" }}{{ $prev = $m.Role }}{{ end }}{{ end }}'
        f"{close}{assistant}"
    )


def _chatml(default_system: str) -> str:
    default = f"<|im_start|>system\n{default_system}<|im_end|>\n" if default_system else ""
    return (
        '{{ $prev := "" }}{{ if or .System .Tools }}<|im_start|>system\n' + _system(".") + "<|im_end|>\n"
        "{{ else }}" + default + "{{ end }}" + _turns("<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>\n")
    )


def _gemma() -> str:
    """Gemma's turns: no system role, so the system text opens the first user turn; the answer's role is model."""
    first = "{{ if $first }}{{ if or $.System $.Tools }}" + _system("$.") + "\n\n{{ end }}{{ $first = false }}{{ end }}"
    return '{{ $prev := "" }}{{ $first := true }}' + _turns(
        "<start_of_turn>user\n", "<start_of_turn>model\n", "<end_of_turn>\n", first
    )


# a default system prompt the model's template writes when the conversation has none (Qwen2.5's,
# SmolLM2's), as its Jinja source spells it (a newline written out or as \n)
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\\n|\n)([^<'\"{}\\]+)<\|im_end\|>")


def go_template(jinja: str) -> str:
    """The Go template of the model whose chat template is ``jinja``: ChatML (Qwen2.5, SmolLM2)
    or Gemma's turns; "" for a format taskrun does not know (the Jinja one is still shown)."""
    if "<|im_start|>" in jinja:
        found = _DEFAULT_SYSTEM.search(jinja)
        return _chatml(found.group(1) if found else "")
    if "<start_of_turn>" in jinja:
        return _gemma()
    return ""
