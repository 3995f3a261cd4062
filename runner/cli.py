"""The `run` command line. One subcommand per task, built from the task's Options dataclass, so a
new task needs no CLI code; plus `tasks`, `models`, `fit`, `logs` (runner/commands/info.py) and `chain`, `ask`
(runner/commands/chain.py).

Kept thin: library errors (TaskError) become one-line click errors here. Set TASKRUN_DEBUG=1 to
see tracebacks. Importing this module must not import torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

import click

from taskrun.runner.runlog import store as runlog
from taskrun.runner.signals import Terminated, exit_code, handle_sigterm, stdout_gone
from taskrun.tasks import REGISTRY
from taskrun.tasks.base import Task, TaskError

# Commands that live in their own modules ("module:attribute"), imported only when used.
EXTRA_COMMANDS: dict[str, str] = {
    "tasks": "taskrun.runner.commands.info:tasks_cmd",
    "models": "taskrun.runner.commands.info:models_cmd",
    "logs": "taskrun.runner.commands.info:logs_cmd",
    "chain": "taskrun.runner.commands.chain:chain_cmd",
    "ask": "taskrun.runner.commands.chain:ask_cmd",
    "fit": "taskrun.runner.commands.info:fit_cmd",
    "serve": "taskrun.runner.commands.serve:serve_cmd",
    "batch": "taskrun.runner.commands.batch:batch_cmd",
    "chat": "taskrun.runner.commands.chat:chat_cmd",
    "cache": "taskrun.runner.commands.cache:cache_cmd",
    "bench": "taskrun.runner.commands.bench:bench_cmd",
    "eval": "taskrun.runner.commands.eval:eval_cmd",
}


def shown(message: str) -> str:
    """A message as the terminal shows it: control characters escaped, a huge one cut."""
    from taskrun.runner.output.terminal import for_terminal

    return for_terminal(message, 4000)


def debug() -> bool:
    return os.environ.get("TASKRUN_DEBUG", "") not in ("", "0")


class TaskRunGroup(click.Group):
    """Lists task commands first; builds each command only when it is asked for."""

    def list_commands(self, ctx):
        return list(REGISTRY) + [c for c in EXTRA_COMMANDS if c not in REGISTRY] + sorted(super().list_commands(ctx))

    def get_command(self, ctx, name):
        if name in REGISTRY:
            return task_command(REGISTRY[name])
        if name in EXTRA_COMMANDS:
            mod, _, attr = EXTRA_COMMANDS[name].partition(":")
            return getattr(importlib.import_module(mod), attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            name = ctx.invoked_subcommand
            if name in REGISTRY:  # a bad option is a failed job too: it goes in the run log
                _log_usage_failure(name, exc.format_message())
            raise
        except TaskError as exc:
            if debug():
                raise
            raise click.ClickException(shown(str(exc))) from None  # escaped, cut at 4000 characters
        except click.exceptions.Exit:
            raise
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (runner/signals.py): the job's row says so
            if debug():
                raise
            click.echo(f"\ninterrupted{' by SIGTERM' if isinstance(exc, Terminated) else ''}", err=True)
            ctx.exit(exit_code(exc))
        except BrokenPipeError:  # `| head -1`: the reader has what it wanted; end quietly, as cat does
            stdout_gone()
            ctx.exit(0)
        except (click.ClickException, click.Abort):
            raise
        except Exception as exc:
            if debug():
                raise
            raise click.ClickException(
                f"internal error: {type(exc).__name__}: {exc} (set TASKRUN_DEBUG=1 to see the traceback)"
            ) from None


def _log_usage_failure(task: str, message: str) -> None:
    from datetime import datetime, timezone

    from taskrun.runner.jobs import new_id
    from taskrun.runner.runlog.store import RunLog

    try:
        log = RunLog()
        if log.problem is None:  # the usage error is what the user must see: no warning beside it
            log.append(
                {
                    "id": new_id(),
                    "task": task,
                    "status": "failed",
                    "error": message,
                    "started_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                }
            )
    except Exception:  # never mask the usage error
        pass


def _no_log_text(ctx: click.Context, param, value: bool) -> None:
    """--no-log-text: this command's jobs keep no texts in the run log (metrics and digests only)."""
    if not value:
        return
    previous, runlog.text_override = runlog.text_override, False

    def restore() -> None:
        runlog.text_override = previous

    ctx.find_root().call_on_close(restore)


NO_LOG_TEXT_HELP = (
    "Keep no prompts, answers or transcripts in the run log, only metrics and digests "
    "[env TASKRUN_LOG_TEXT=0; config: [log] text = false]."
)


@click.group(cls=TaskRunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="taskrun", message="taskrun %(version)s")
@click.option("--no-log-text", is_flag=True, expose_value=False, callback=_no_log_text, help=NO_LOG_TEXT_HELP)
@click.pass_context
def main(ctx):
    """taskrun: name the task, then the input. Each task has its own options, results and metrics.

    \b
      run tasks                       what each task takes, returns and measures
      run transcribe meeting.wav      a transcript with timestamps
      run embed "a sentence"          vectors
      run classify photo.jpg          labels with scores
    """
    ctx.call_on_close(handle_sigterm())  # SIGTERM ends a job as Ctrl-C does; put back after


# --------------------------------------------------------------------------- task commands


def _field_type(f: dataclasses.Field):
    """The click type of an Options field: from its choices, its default, or its annotation."""
    if f.metadata.get("choices"):
        return click.Choice(f.metadata["choices"])
    d = f.default
    if isinstance(d, bool):
        return bool
    if isinstance(d, (int, float, str)):
        return type(d)
    ann = str(f.type)
    for name, t in (("int", int), ("float", float), ("Path", click.Path()), ("str", str)):
        if name in ann:
            return t
    return str


def _option_params(options_cls: type) -> list[click.Parameter]:
    params = []
    for f in dataclasses.fields(options_cls):
        meta = f.metadata
        if not meta.get("cli", True):
            continue
        flags = list(meta.get("flags") or ("--" + f.name.replace("_", "-"),))
        kind = _field_type(f)
        help_ = meta.get("help", "")
        if kind is bool:
            if len(flags) == 1 and "/" not in flags[0]:
                name = flags[0].lstrip("-")
                flags = [f"--{name}/--no-{name}"]
            params.append(click.Option(flags + [f.name], default=f.default, help=help_, show_default=True))
        elif meta.get("multiple"):
            params.append(
                click.Option(
                    flags + [f.name],
                    multiple=True,
                    type=kind,
                    default=f.default,
                    help=help_,
                    metavar=meta.get("metavar"),
                )
            )
        else:
            params.append(
                click.Option(
                    flags + [f.name],
                    type=kind,
                    default=f.default,
                    help=help_,
                    show_default=f.default is not None,
                    metavar=meta.get("metavar"),
                )
            )
    return params


def _common_params(task: Task) -> list[click.Parameter]:
    return _model_params(task) + _output_params(task) + _server_params() + _then_params(task)


def _model_params(task: Task) -> list[click.Parameter]:
    """Where the inputs come from, and which model runs them where."""
    return [
        click.Option(
            ["-f", "--file", "files"],
            multiple=True,
            type=click.Path(exists=True, dir_okay=True),
            help="Read inputs from a file ("
            + ("one per line" if task.text_file == "lines" else "its whole text")
            + " for text) or a folder. Repeatable.",
        ),
        click.Option(
            ["-m", "--model"],
            help="Model alias (see `run models`), local folder or file, "
            "or hub id org/name[@revision]. Default: the task's default.",
        ),
        click.Option(["--runtime"], help="Runtime to run the model on (default: the model's)."),
        click.Option(["--device"], default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps."),
        click.Option(
            ["--dtype"],
            default="auto",
            show_default=True,
            type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
            help="Weights/compute dtype; auto picks the fastest that keeps accuracy.",
        ),
        click.Option(["--offline"], is_flag=True, help="Never reach the network for models."),
    ]


def _output_params(task: Task) -> list[click.Parameter]:
    """What the job prints and writes, and what the run log keeps."""
    fmt_help = f"Output format: {', '.join(task.formats)}."
    return [
        click.Option(["--json", "json_mode"], is_flag=True, help="One JSON object for the job on stdout."),
        click.Option(["--format", "fmt"], type=click.Choice(task.formats), default=None, help=fmt_help),
        click.Option(
            ["-o", "--output"],
            type=click.Path(dir_okay=False),
            help="Write the result to this file (written whole, or not at all).",
        ),
        click.Option(
            ["--log-db"],
            type=click.Path(dir_okay=False),
            envvar="TASKRUN_LOG_DB",
            help="Run log SQLite file [env TASKRUN_LOG_DB].",
        ),
        click.Option(["-q", "--quiet"], is_flag=True, help="No progress or metrics on stderr."),
        click.Option(["--no-log-text"], is_flag=True, expose_value=False, callback=_no_log_text, help=NO_LOG_TEXT_HELP),
    ]


def _server_params() -> list[click.Parameter]:
    """The job run on a warm `run serve` instead of here."""
    return [
        click.Option(
            ["--server"],
            envvar="TASKRUN_SERVER",
            metavar="URL",
            help="Run the job on a warm `run serve` at URL (e.g. http://127.0.0.1:8080); the "
            "output is a local run's. Inputs are read here and sent; the server logs the "
            "job. --then chains still run here [env TASKRUN_SERVER].",
        ),
        click.Option(
            ["--api-key"],
            envvar="TASKRUN_API_KEY",
            metavar="KEY",
            help="The key of a server started with --api-key [env TASKRUN_API_KEY].",
        ),
    ]


def _then_params(task: Task) -> list[click.Parameter]:
    """--then: hand the job's text to the next task (a two-stage chain)."""
    return (
        [
            click.Option(
                ["--then", "then"],
                multiple=True,
                metavar="TASK",
                help=f"Hand this job's {task.produces} to another task: --then summarize, or "
                f"--then summarize=MODEL; "
                f"each stage is logged and measured separately. Repeatable.",
            )
        ]
        if task.produces
        else []
    )


# The options every task command takes (_common_params), and which of them each way of running reads.
_COMMON = (
    "files",
    "model",
    "runtime",
    "device",
    "dtype",
    "json_mode",
    "fmt",
    "output",
    "offline",
    "log_db",
    "quiet",
    "server",
    "api_key",
)
_REMOTE = ("server", "api_key", "files", "model", "runtime", "device", "dtype", "json_mode", "fmt", "output", "quiet")
_LOCAL = (
    "files",
    "model",
    "runtime",
    "device",
    "dtype",
    "json_mode",
    "fmt",
    "output",
    "offline",
    "log_db",
    "quiet",
    "server",
)


ENDPOINT_TASKS = ("generate", "embed", "transcribe")  # the tasks `--endpoint URL` runs (runner/commands/endpoint.py)
ENDPOINT_OPTIONS = ("endpoint", "endpoint_kind", "api_key_env", "endpoint_prompt", "endpoint_temperature")


def task_command(task: Task) -> click.Command:
    params: list[click.Parameter] = [click.Argument(["inputs"], nargs=-1)]
    params += _option_params(task.Options) + _common_params(task)
    extra = getattr(task, "cli_params", None)
    if extra:
        params += extra()
    if task.name in ENDPOINT_TASKS:
        from taskrun.runner.commands.endpoint import endpoint_params

        params += endpoint_params(task.name)

    def callback(inputs, **kw):
        common = {k: kw.pop(k) for k in _COMMON}
        handled = {p.name for p in (extra() if extra else [])} | {"then"}
        extras = {k: kw.pop(k) for k in list(kw) if k in handled}
        endpoint = {k: kw.pop(k) for k in ENDPOINT_OPTIONS if k in kw}
        values = dict(kw)  # the task's own options
        if task.name == "transcribe":
            from taskrun.runner.commands.endpoint import refuse_endpoint_only

            refuse_endpoint_only(endpoint)
        if endpoint.get("endpoint"):  # the job runs on an OpenAI-/Ollama-compatible server
            from taskrun.runner.commands.endpoint import execute_endpoint

            return execute_endpoint(task, inputs=inputs, values=values, common=common, extras=extras, **endpoint)
        if common["server"] and not extras.get("then"):  # imports neither torch nor the chain engine: starts fast
            from taskrun.runner.remote.client import execute_remote

            return execute_remote(task, inputs=inputs, values=values, **{k: common[k] for k in _REMOTE})
        from taskrun.runner.commands.task import execute

        return execute(task, inputs=inputs, values=values, extras=extras, **{k: common[k] for k in _LOCAL})

    arg_help = (
        f"\n\nInputs: {task.takes}.\n\nReturns: {task.returns}.\n\n"
        f"Measures: {', '.join(f.name for f in dataclasses.fields(task.Metrics))}."
    )
    return click.Command(
        task.name, params=params, callback=callback, help=task.summary + arg_help, short_help=task.summary
    )


__all__ = ["main"]
