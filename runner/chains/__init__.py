"""Chains: several tasks in a row, each stage a logged job (``run``), declared in a TOML chain file
whose shape ``file`` checks; ``--then`` is a two-stage chain built in code.
"""
