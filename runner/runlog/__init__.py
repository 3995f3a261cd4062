"""The run log: every job in one SQLite file (``store``), found again by its texts (``search``),
its faults put in words (``faults``), and rows of killed jobs told from live ones (``liveness``).
"""
