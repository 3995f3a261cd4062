"""Chains: several tasks in a row, each stage a logged job (``run``), declared in a TOML chain file
(``file`` reads its shape, ``check`` wires it before weights load); ``--then`` is a chain in code.
"""
