"""What `run bench` measures and how: contenders timed side by side in processes of their own
(``core``), the suites per task (``suites``, ``embed``, ``classify``, ``more``) and the host (``host``).
"""
