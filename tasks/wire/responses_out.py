"""A Responses API ``response`` object (and, streamed, its events) built from the chat answer
(tasks/wire/responses_api.py reads the request). Torch- and web-framework-free.
"""

from __future__ import annotations

import time

from taskrun.tasks.wire.responses_api import ResponsesRequest, new_id


class ResponseBuilder:
    """A ``response`` object built from the chat answer, whole (``from_chat``) or chunk by chunk
    (``events``: the Responses stream's events for one chat chunk; ``finish``: the last ones)."""

    def __init__(self, req: ResponsesRequest, model: str) -> None:
        self.req, self.model = req, model
        self.created = int(time.time())
        self.text = ""
        self.calls: list[dict] = []
        self.reason: str | None = None
        self.usage: dict | None = None
        self.run_id: str | None = None
        self.message_id = new_id("msg")  # the open (or next) message item's id
        self.items: list[dict] = []  # the output in order: {"message": id, "text": str} or {"call": call}
        self._seq = 0
        self._open = False  # a message item is open (announced, not yet done)

    def response(self, status: str) -> dict:
        body = self.req.body
        output = [self._item(item) for item in self.items or [{"message": self.message_id, "text": ""}]]
        fmt = (body.get("text") or {}).get("format") or {"type": "text"}
        out = {
            "id": self.req.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.model,
            "output": output if status != "in_progress" else [],
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": self.req.keep,
            "temperature": body.get("temperature"),
            "text": {"format": fmt},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "truncation": "disabled",
            "usage": self._usage() if status != "in_progress" else None,
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }
        if self.run_id:
            out["run_id"] = self.run_id
        return out

    def status(self) -> str:
        return "incomplete" if self.reason == "length" else "completed"

    def _message(self, content: list, status: str, item_id: str | None = None) -> dict:
        mid = item_id or self.message_id
        return {"id": mid, "type": "message", "status": status, "role": "assistant", "content": content}

    def _item(self, item: dict) -> dict:
        if "call" in item:
            return self._call(item["call"], "completed")
        part = {"type": "output_text", "text": item["text"], "annotations": [], "logprobs": []}
        return self._message([part], "completed", item["message"])

    def _call(self, call: dict, status: str) -> dict:
        fn = call["function"]
        args = fn["arguments"] if status == "completed" else ""
        return {
            "id": "fc_" + call["id"].removeprefix("call_"),
            "type": "function_call",
            "status": status,
            "call_id": call["id"],
            "name": fn["name"],
            "arguments": args,
        }

    def _usage(self) -> dict:
        u = self.usage or {}
        prompt, completion = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }

    def from_chat(self, chat: dict) -> dict:
        """The finished response from a chat.completion body."""
        choice = chat["choices"][0]
        message = choice["message"]
        self.text = message.get("content") or ""
        self.calls = list(message.get("tool_calls") or [])
        self.items = [{"message": self.message_id, "text": self.text}] if self.text or not self.calls else []
        self.items += [{"call": c} for c in self.calls]
        self.reason, self.usage = choice["finish_reason"], chat.get("usage")
        return self.response(self.status())

    def conversation(self) -> list[dict]:
        """The request's messages and this answer, for a later previous_response_id."""
        answer: dict = {"role": "assistant", "content": self.text or None}
        if self.calls:
            answer["tool_calls"] = self.calls
        return [*self.req.messages, answer]

    # ------------------------------------------------------------------ streaming

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def start(self) -> list[dict]:
        first = self.response("in_progress")
        return [self._event("response.created", response=first), self._event("response.in_progress", response=first)]

    def _open_message(self) -> list[dict]:
        if self._open:
            return []
        self._open = True
        self.items.append({"message": self.message_id, "text": ""})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        n = len(self.items) - 1
        ids = {"output_index": n, "item_id": self.message_id, "content_index": 0}
        return [
            self._event("response.output_item.added", output_index=n, item=self._message([], "in_progress")),
            self._event("response.content_part.added", part=part, **ids),
        ]

    def events(self, chunk: dict) -> list[dict]:
        """The events for one chat.completion.chunk (tasks/wire/openai_out.py's CompletionChunks)."""
        out: list[dict] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("run_id"):
            self.run_id = chunk["run_id"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._open_message()
                self.text += delta["content"]
                self.items[-1]["text"] += delta["content"]
                ids = {"output_index": len(self.items) - 1, "item_id": self.message_id, "content_index": 0}
                out.append(self._event("response.output_text.delta", delta=delta["content"], logprobs=[], **ids))
            for call in delta.get("tool_calls") or ():
                out += self._close_message()
                call = {k: v for k, v in call.items() if k != "index"}
                self.calls.append(call)
                self.items.append({"call": call})
                n = len(self.items) - 1
                item = self._call(call, "in_progress")
                args = call["function"]["arguments"]
                out.append(self._event("response.output_item.added", output_index=n, item=item))
                ids = {"output_index": n, "item_id": item["id"]}
                out.append(self._event("response.function_call_arguments.delta", delta=args, **ids))
                out.append(
                    self._event("response.function_call_arguments.done", arguments=args, name=item["name"], **ids)
                )
                out.append(self._event("response.output_item.done", output_index=n, item=self._call(call, "completed")))
            if choice.get("finish_reason"):
                self.reason = choice["finish_reason"]
        return out

    def _close_message(self) -> list[dict]:
        if not self._open:
            return []
        self._open = False
        n, text = len(self.items) - 1, self.items[-1]["text"]
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        ids = {"output_index": n, "item_id": self.message_id, "content_index": 0}
        done = [
            self._event("response.output_text.done", text=text, logprobs=[], **ids),
            self._event("response.content_part.done", part=part, **ids),
            self._event("response.output_item.done", output_index=n, item=self._message([part], "completed")),
        ]
        self.message_id = new_id("msg")  # text after a call is a message item of its own
        return done

    def finish(self) -> list[dict]:
        """The last events: the message closed (announced even when empty, as OpenAI does for a
        text answer) and ``response.completed`` (or ``response.incomplete``) with the whole response."""
        out = [] if self.calls else self._open_message()
        out += self._close_message()
        status = self.status()
        out.append(self._event(f"response.{status}", response=self.response(status)))
        return out
