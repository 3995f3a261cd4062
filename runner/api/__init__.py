"""The Python API, a door like the CLI and the server: ``taskrun.run``, ``taskrun.stream``,
``taskrun.load`` and ``taskrun.tasks`` (re-exported by the top-level ``taskrun`` package).

calls.py turns Python values into a job (inputs as the CLI reads its arguments, options through
the task's Options and their checks) and runs it with ``runner.jobs.run_job``, so a call gets the
same checks, errors, metrics and run-log row as a command-line job; results.py gives the task's
typed results their job's metrics and run id; stream.py turns the job's events into an iterator.
"""

from taskrun.runner.api.calls import Model, load, run, stream, tasks
from taskrun.runner.api.results import JobInfo, Results, RunMetrics, UnfinishedJob
from taskrun.runner.api.stream import Stream

__all__ = ["JobInfo", "Model", "Results", "RunMetrics", "Stream", "UnfinishedJob", "load", "run", "stream", "tasks"]
