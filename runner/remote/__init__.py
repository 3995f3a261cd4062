"""`run TASK --server URL`: the job runs on a warm `run serve` (``client``) over HTTP (``http``),
and its JSON record is turned back into the task's own results (``records``) to print as a local run.
"""
