"""How results reach the user: stdout and stderr and files written whole (``writer``), where a
job may write (``paths``), and text made safe for a terminal (``terminal``). Every door uses these.
"""
