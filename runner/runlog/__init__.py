"""The run log: every job in one SQLite file (``store``, its ``schema`` and a job's ``rows``), found
again by its texts (``search``), its faults in words (``faults``), killed jobs told from live ones
(``liveness``).
"""
