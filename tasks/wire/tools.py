"""Tool calling on the chat doors: OpenAI's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
(and Ollama's ``tools``) → a generate job, and the model's answer → ``tool_calls``.

The tools are told to the model in the Hermes format that Qwen2.5's chat template writes (and
that SmolLM2 follows from a system prompt): the signatures inside ``<tools></tools>`` in the system
prompt, each call answered as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, each
result fed back as a user turn inside ``<tool_response></tool_response>``. An answer that is
nothing but calls written as bare JSON (``{"name": ..., "arguments": ...}``, in a code fence or
not: what Qwen2.5-Coder writes) is read as those calls too, as llama.cpp's Hermes parser reads it. With ``tool_choice``
``required`` or a named function the answer is decoded under a grammar (generate's json_schema:
pipelines/llm/grammar.py) built from the functions' parameter schemas, so the arguments always
parse and validate; with ``auto`` the model chooses, and what it wrote is parsed.
Torch- and web-framework-free.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from taskrun.tasks.wire.errors import invalid, unsupported

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
MAX_TOOLS = 128

SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[dict, ...]  # each {"name", "description", "parameters"}
    choice: str  # auto | required | the name of the function that must be called
    parallel: bool  # several calls in one answer allowed (OpenAI's default: true)

    def system(self, system: str) -> str:
        """The system prompt with the tools' signatures (Qwen2.5's own wording)."""
        lines = "\n".join(json.dumps({"type": "function", "function": t}) for t in self.tools)
        return SYSTEM.format(tools=lines) + ("\n\n" + system if system else "")

    def schema(self) -> dict | None:
        """The JSON Schema the answer is held to (None: auto, the model chooses)."""
        if self.choice == "auto":
            return None
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.tools
            if self.choice in ("required", t["name"])
        ]
        return calls[0] if len(calls) == 1 else {"anyOf": calls}

    def calls(self, result) -> tuple[str | None, list[dict]]:
        """(the text left outside the calls or None, the calls as OpenAI's tool_calls)."""
        names = {t["name"] for t in self.tools}
        if result.json is not None and self.choice != "auto":
            found = [result.json]
            rest = ""
        else:
            found, rest = [], result.text
            for m in _CALL.finditer(result.text):
                call = _parse(m.group(1), names)
                if call is not None:
                    found.append(call)
                    rest = rest.replace(m.group(0), "", 1)
            if not found:
                found = bare_calls(result.text, names)
                rest = "" if found else rest
        if not self.parallel:
            found = found[:1]
        tool_calls = [_openai_call(c) for c in found]
        rest = rest.strip()
        return (rest or None) if tool_calls else result.text, tool_calls


OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _openai_call(call: dict) -> dict:
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments") or {})},
    }


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def bare_calls(text: str, names: set[str]) -> list[dict]:
    """The calls of an answer that is only calls written as bare JSON objects (one or more, in a
    code fence or not), each to a known function; [] for any other answer."""
    fenced = _FENCE.match(text)
    body = (fenced.group(1) if fenced else text).strip()
    if not body.startswith("{"):
        return []
    decoder, at, calls = json.JSONDecoder(), 0, []
    while at < len(body):
        try:
            value, end = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            return []
        call = _parse(json.dumps(value), names) if isinstance(value, dict) and "name" in value else None
        if call is None:
            return []
        calls.append(call)
        at = end
        while at < len(body) and body[at] in " \t\r\n,":
            at += 1
    return calls


def _parse(text: str, names: set[str]) -> dict | None:
    """One call the model wrote, or None where it is not a call to a known function."""
    try:
        call = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") not in names:
        return None
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return {"name": call["name"], "arguments": args} if isinstance(args, dict) else None


def tool_request(body: dict) -> ToolRequest | None:
    """The request's tools and how they may be called; None when no tool may be called."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "'parallel_tool_calls' must be true or false")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise invalid("tool_choice", "'tool_choice' names a tool but the request has no 'tools'")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise invalid("tools", f"'tools' must be a list of up to {MAX_TOOLS} functions")
    read = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(tools))
    names = [t["name"] for t in read]
    if len(set(names)) != len(names):
        raise invalid("tools", "two tools have the same name")
    if choice in (None, "auto", "required", "none"):
        mode = choice or "auto"
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        mode = choice["function"].get("name")
        if mode not in names:
            raise invalid("tool_choice", f"tool_choice names {json.dumps(mode)}, which is not in 'tools'")
    else:
        raise invalid(
            "tool_choice",
            '\'tool_choice\' must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
        )
    if mode == "none":
        return None
    return ToolRequest(read, mode, parallel is not False)


def _tool(tool: Any, where: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise invalid(where, f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}')
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(f"{where}.function.name", "a function name is 1 to 64 letters, digits, _ . or -")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise invalid(f"{where}.function.parameters", "'parameters' must be a JSON Schema object")
    out = {"name": name, "description": fn.get("description") or "", "parameters": params}
    return out


def plain_messages(messages: Any) -> Any:
    """OpenAI messages with tool calls and tool results rewritten as the text turns the Hermes
    format gives them; other messages pass unchanged (chat_messages checks them)."""
    if not isinstance(messages, list):
        return messages
    out: list[Any] = []
    called = False
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        where = f"messages[{i}]"
        if m.get("role") == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": _assistant_text(m, where)})
            called = True
        elif m.get("role") == "tool":
            if not called:
                raise unsupported(f"{where}.role", "a tool message must answer an assistant message's tool_calls")
            text = _text(m.get("content"), f"{where}.content")
            turn = f"<tool_response>\n{text}\n</tool_response>"
            prev = out[-1] if out else None
            if prev is not None and prev.get("role") == "user" and prev.get("_tool"):
                prev["content"] += "\n" + turn
            else:
                out.append({"role": "user", "content": turn, "_tool": True})
        else:
            out.append(m)
    return [{k: v for k, v in m.items() if k != "_tool"} if isinstance(m, dict) else m for m in out]


def _assistant_text(m: dict, where: str) -> str:
    calls = m["tool_calls"]
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls", "'tool_calls' must be a list")
    parts = [_text(m.get("content"), f"{where}.content")] if m.get("content") else []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"{where}.tool_calls[{j}]", "a tool call is {'function': {'name', 'arguments'}}")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                raise invalid(f"{where}.tool_calls[{j}].function.arguments", "arguments must be JSON") from None
        parts.append("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args or {}}) + "\n</tool_call>")
    return "\n".join(parts)


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    if isinstance(content, (dict, list)):
        return json.dumps(content)
    raise invalid(where, f"{where} must be a string or a list of text parts")


# --------------------------------------------------------------------------- OpenAPI request bodies

FUNCTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": _NAME.pattern},
        "description": {"type": ["string", "null"]},
        "parameters": {"type": ["object", "null"], "description": "a JSON Schema (default: no arguments)"},
    },
}
TOOLS_SCHEMA = {
    "type": ["array", "null"],
    "maxItems": MAX_TOOLS,
    "items": {
        "type": "object",
        "required": ["type", "function"],
        "properties": {"type": {"const": "function"}, "function": FUNCTION_SCHEMA},
    },
}
TOOL_CHOICE_SCHEMA = {
    "anyOf": [
        {"enum": ["auto", "none", "required", None]},
        {
            "type": "object",
            "required": ["type", "function"],
            "properties": {
                "type": {"const": "function"},
                "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            },
        },
    ]
}
TOOL_CALLS_SCHEMA = {
    "type": ["array", "null"],
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["function"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "arguments": {"type": ["string", "object"], "description": "JSON text (OpenAI) or an object"},
                },
            },
        },
    },
}
