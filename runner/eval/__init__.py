"""`run eval`: the same cases and acceptance checks over several setups (local models with their
options, OpenAI- or Ollama-compatible endpoints): cases.py (the case file and each check),
setups.py (a setup as text or a TOML file, with its price), attempt.py (one attempt of one case
on one setup, logged as a run-log row of the eval's chain id), report.py (the table per setup, the
grid, the verdict). A door: it imports no other door.
"""
