"""The front doors, with no model code: the CLI (``cli`` and ``commands/``), chains, the run log,
the server, batch jobs, the ``--server`` client and the benchmark command, over one job runner.

Top level: ``cli`` (the ``run`` entry point), and the three modules every door shares: ``jobs``
(run one job: resolve, check, load, run, log), ``inputs`` (what arguments and files mean as task
inputs and options) and ``signals`` (SIGTERM as Ctrl-C, a closed stdout). Subpackages:
``commands`` (every click command), ``chains``, ``runlog``, ``output``, ``remote``, ``serve``,
``batch``, ``bench``. No door imports another door (tests/test_layout.py).
"""
