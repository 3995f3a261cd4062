"""`run batch`: many jobs from a JSONL file or a folder, one resumable JSONL line per item.

Modules: ``source`` (reading the input: its format, its ids, the
files of a folder), ``journal`` (the output file: append, flush, fsync, resume, torn lines),
``work`` (items → grouped ``run_job`` calls → output lines; shared by both engines), ``lines``
(the output line shapes and side files), ``local`` (the in-process engine), ``ray_engine`` (the
same work on Ray Data actors), ``progress`` (the bar, the periodic lines, the summary).
The click command is runner/commands/batch.py. Importing this package imports nothing heavy
(no torch, no ray).
"""
