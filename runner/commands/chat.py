"""`run chat`: a multi-turn conversation with a language model, typed or piped in line by line.

Each turn is one generate job (runner/jobs.py ``run_job``) with the earlier turns as its
``history`` option, so every turn is logged and measured like `run generate`; the weights stay
loaded between turns (the in-process model cache). The conversation is kept within the model's
window by dropping the oldest turns, with a note saying so.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

from taskrun.tasks.base import TaskError

COMMANDS = "/reset (forget the conversation), /save FILE (write it as JSON), /exit (or Ctrl-D)"


@dataclass
class Chat:
    """The conversation and how each turn is run."""

    system: str
    sampling: dict  # generate's options for every turn (max_tokens, temperature, ...)
    job: dict  # run_job's keywords: model, runtime, device, dtype, offline
    quiet: bool = False
    turns: list[tuple[str, str]] = field(default_factory=list)  # (role, text), user then assistant
    log: object = None  # the RunLog every turn is appended to
    failed: int = 0
    asked: int = 0
    _llm: object = None
    endpoint: object = None  # an Endpoint (--endpoint URL): every turn runs there (runner/endpoints.py)
    _costs: dict = field(default_factory=dict)  # (user turn, assistant turn) → its prompt tokens

    def ask(self, text: str) -> None:
        """One turn: fit the history to the window, run the job (streaming), keep the answer."""
        from taskrun.runner.jobs import run_job
        from taskrun.runner.output.writer import EventPrinter
        from taskrun.tasks import REGISTRY
        from taskrun.tasks.base import Input, make_options

        self.asked += 1
        if self.endpoint is None:  # an endpoint keeps its own window
            self._fit(text)
        task = REGISTRY["generate"]
        options = make_options(
            task.Options, {**self.sampling, "system": self.system, "history": tuple(self.turns), "stream": True}
        )
        printer = EventPrinter(task, options, json_mode=False, quiet=self.quiet)
        try:
            rec = (
                self._on_endpoint(options, text, printer)
                if self.endpoint
                else run_job(
                    task,
                    lambda: [Input(source="chat", kind="text", text=text)],
                    options,
                    log=self.log,
                    on_event=printer,
                    **self.job,
                )
            )
        except TaskError as exc:
            self.failed += 1
            click.secho(f"error: {exc}", err=True, fg="red")
            return
        finally:
            printer.close()
        answer = rec.results[0].text
        self.turns += [("user", text), ("assistant", answer)]
        if not self.quiet:
            click.secho(turn_line(rec), err=True, dim=True)

    def _on_endpoint(self, options, text: str, printer):
        from taskrun.runner.commands.endpoint import messages_of
        from taskrun.runner.endpoints import generate_job
        from taskrun.tasks import events as ev

        rec, _ = generate_job(
            self.endpoint,
            messages_of(options, text),
            options,
            prompt=text,
            log=self.log,
            on_text=lambda t: printer(ev.Token(t, 0)),
        )
        for it in rec.items:
            printer(it)
        return rec

    def _fit(self, text: str) -> None:
        """Drop the oldest turns until the prompt leaves the answer room in the window. Linear in
        the turns (a --load of thousands): each pair of turns is tokenised once (its cost: what it
        adds to the prompt, kept between turns), the pairs to drop are found from the newest back
        by their summed costs, and one full render checks the result."""
        if not self.turns:
            return
        llm = self._engine()
        room = min(self.sampling.get("max_tokens", 256), llm.context // 2)

        def size(history: tuple) -> int:
            return len(llm.prompt_ids(text, self.system, False, "", history))

        if size(tuple(self.turns)) + room <= llm.context:
            return
        base = size(())
        pairs = [tuple(self.turns[i : i + 2]) for i in range(0, len(self.turns), 2)]
        total, keep = base + room, 0
        for pair in reversed(pairs):
            if pair not in self._costs:
                self._costs[pair] = size(pair) - base
            if total + self._costs[pair] > llm.context:
                break
            total, keep = total + self._costs[pair], keep + 1
        dropped = len(pairs) - keep
        del self.turns[: 2 * dropped]
        while self.turns and size(tuple(self.turns)) + room > llm.context:  # a template that adds up otherwise
            del self.turns[:2]
            dropped += 1
        if dropped:
            click.secho(
                f"note: dropped the {dropped} oldest turn{'s' * (dropped > 1)} to fit the {llm.context}-token window",
                err=True,
                fg="yellow",
            )

    def _engine(self):
        """The loaded model (the same cached one the jobs use), to count the prompt's tokens."""
        if self._llm is None:
            from taskrun.models.resolve import default_model, resolve
            from taskrun.pipelines import load_pipeline

            job = self.job
            card = resolve(job["model"] or default_model("generate", "text"), offline=job["offline"])
            pipe = load_pipeline("generate", card, job["runtime"] or card.runtime, job["device"], job["dtype"])
            self._llm = pipe.engine
        return self._llm

    def command(self, line: str) -> bool:
        """Run a /command; False for /exit."""
        name, _, arg = line.partition(" ")
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/reset":
            self.turns.clear()
            click.secho("note: conversation cleared", err=True, fg="yellow")
        elif name == "/save" and arg.strip():
            save(self, arg.strip())
            click.secho(f"note: saved {len(self.turns) // 2} turns to {arg.strip()}", err=True, fg="yellow")
        else:
            click.secho(f"error: unknown command {line!r}; the commands are {COMMANDS}", err=True, fg="red")
        return True


def turn_line(rec) -> str:
    """One line of a turn's numbers, generate's metrics in short."""
    m = rec.metrics
    kept = f" ({m.cached_prompt_tokens} cached)" if m.cached_prompt_tokens else ""
    return (
        f"[{m.input_tokens} prompt{kept} + {m.output_tokens} answer tokens · ttft {m.ttft_s:.2f} s · "
        f"prefill {m.prefill_s:.3f} s · {m.decode_tokens_per_s:.1f} tok/s · {m.finish_reason} · "
        f"run {rec.id}]"
    )


def save(chat: Chat, path: str) -> None:
    from taskrun.runner.output.safe import write_file

    body = {"system": chat.system, "turns": [{"role": r, "content": t} for r, t in chat.turns]}
    # The -o rules: no device node, no symlink, not the --load file's own inode by surprise.
    write_file(path, json.dumps(body, ensure_ascii=False, indent=1) + "\n", what="/save")


def load(path: str) -> tuple[str, list[tuple[str, str]]]:
    """(system, turns) of a conversation written by /save."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
        turns = [(t["role"], t["content"]) for t in body["turns"]]
    except RecursionError:
        raise TaskError(f"--load {path}: nested too deep to be a conversation saved by /save") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TaskError(
            f"--load {path}: not a conversation saved by /save ({exc}); give a file written by /save"
        ) from None
    if any(r not in ("user", "assistant") or not isinstance(t, str) for r, t in turns):
        raise TaskError(f"--load {path}: each turn needs role user or assistant and a text content")
    for n, (_, t) in enumerate([("", str(body.get("system") or ""))] + turns):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as exc:
            where = "the system prompt" if n == 0 else f"turn {n}"
            raise TaskError(
                f"--load {path}: {where} holds a lone surrogate ({exc.object[exc.start : exc.end]!r} at "
                f"character {exc.start}), which no text can carry; fix or remove it"
            ) from None
    return str(body.get("system") or ""), turns


def lines(interactive: bool):
    """The user's lines: typed at a prompt (with line editing) or read from a pipe; ends at EOF."""
    if not interactive:
        yield from (line.rstrip("\n") for line in sys.stdin)
        return
    import readline  # noqa: F401  (line editing and history for input())

    while True:
        try:
            yield input(">>> ")
        except KeyboardInterrupt:  # Ctrl-C drops the line being typed, as in Python's REPL
            click.echo("", err=True)
        except EOFError:
            click.echo("", err=True)
            return


@click.command("chat")
@click.option("-m", "--model", help="Model alias (see `run models`), folder or file. Default: generate's.")
@click.option("--runtime", help="Runtime to run the model on (default: the model's).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps.")
@click.option(
    "--dtype",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    help="Weights/compute dtype.",
)
@click.option("--system", default="", help="System prompt for the whole conversation.")
@click.option(
    "--load", "load_path", type=click.Path(exists=True, dir_okay=False), help="Resume a conversation written by /save."
)
@click.option("--max-tokens", default=256, show_default=True, type=int, help="Most tokens per answer.")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="Nucleus sampling mass.")
@click.option("--top-k", default=0, show_default=True, type=int, help="Sample among the k likeliest (0 = off).")
@click.option("--seed", type=int, help="Random seed for sampling (default: a new one per turn).")
@click.option(
    "--repeat-penalty",
    default=1.0,
    show_default=True,
    type=float,
    help="Above 1, makes tokens the answer already holds less likely.",
)
@click.option("--stop", multiple=True, metavar="TEXT", help="Stop an answer at this text. Repeatable.")
@click.option(
    "--draft",
    default="",
    metavar="MODEL",
    help="A small model of the same tokenizer proposing tokens to verify (speculative decoding, "
    "llama.cpp). Default: the model's `draft` in models.toml; `none`: off.",
)
@click.option("--draft-tokens", default=0, show_default=True, type=int, help="Tokens per draft step (0 = adaptive).")
@click.option("--offline", is_flag=True, help="Never reach the network for models.")
@click.option(
    "--log-db",
    type=click.Path(dir_okay=False),
    envvar="TASKRUN_LOG_DB",
    help="Run log SQLite file [env TASKRUN_LOG_DB]; every turn is a row.",
)
@click.option("-q", "--quiet", is_flag=True, help="No per-turn numbers on stderr.")
def chat_cmd(model, runtime, device, dtype, system, load_path, offline, log_db, quiet, **sampling):
    """Talk with a language model, turn by turn: each line you type (or pipe in) is a turn, its
    answer streamed, its numbers on one line; every turn is a logged generate job.

    \b
    Commands: /reset, /save FILE, /exit (or Ctrl-D).
      run chat --system "You are terse."
      printf 'Hi\\nWhat did I just say?\\n' | run chat
    """
    from taskrun.runner.commands.endpoint import make_endpoint
    from taskrun.runner.runlog.store import RunLog
    from taskrun.tasks import REGISTRY
    from taskrun.tasks.base import make_options

    url, kind, key_env = (sampling.pop(k) for k in ("endpoint", "endpoint_kind", "api_key_env"))
    endpoint = make_endpoint(url, model, kind, key_env) if url else None
    sampling["stop"] = tuple(sampling["stop"])  # the rest: max_tokens, temperature, top_p, top_k, seed, ...
    make_options(REGISTRY["generate"].Options, sampling)  # a bad value is refused before any load
    turns: list[tuple[str, str]] = []
    if load_path:
        saved_system, turns = load(load_path)
        system = system or saved_system
    chat = Chat(
        system=system,
        sampling=sampling,
        quiet=quiet,
        turns=turns,
        log=RunLog(log_db),
        job={"model": model, "runtime": runtime, "device": device, "dtype": dtype, "offline": offline},
        endpoint=endpoint,
    )
    converse(chat, quiet)


def converse(chat: Chat, quiet: bool) -> None:
    """The conversation, line by line, until /exit or the end of input; a failed turn is said and
    counted, and the command fails at the end when any did."""
    interactive = sys.stdin.isatty()
    if interactive and not quiet:
        click.secho(f"chat: {COMMANDS}", err=True, dim=True)
    for line in lines(interactive):
        text = line.strip()
        if not text:
            continue
        try:
            if text.startswith("/"):
                if not chat.command(text):
                    break
                continue
            chat.ask(text)
        except TaskError as exc:  # e.g. /save to a folder that does not exist
            click.secho(f"error: {exc}", err=True, fg="red")
        except KeyboardInterrupt:  # stops this answer; the conversation goes on
            chat.failed += 1
            click.secho("\n[interrupted]", err=True, fg="yellow")
    if chat.failed:
        raise click.ClickException(f"{chat.failed} of {chat.asked} turns failed (see the errors above)")


def _with_endpoint_options(cmd: click.Command) -> click.Command:
    from taskrun.runner.commands.endpoint import endpoint_params

    cmd.params.extend(endpoint_params())
    return cmd


_with_endpoint_options(chat_cmd)
