"""What `run bench` measures and how: contenders timed side by side in processes of their own
(``core``), per task suites (``suites``, ``more``, ``classify``) and the host they ran on (``host``).
"""
