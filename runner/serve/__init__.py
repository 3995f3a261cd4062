"""`run serve`: one warm process behind OpenAI-, Ollama- and taskrun-native HTTP APIs; HTTP only
(the request and response shapes are tasks/wire/, shared with ``run batch`` and the clients).

Modules: ``app`` (the FastAPI app factory), ``routes_openai`` / ``routes_ollama`` /
``routes_native`` (the endpoints), ``httpio`` (bodies, run-id headers, streams), ``service`` and
``workers`` (per-model queues and threads), ``batching`` (dynamic batching of embeddings),
``catalogue`` (the models served), ``metrics`` (Prometheus), ``security`` (keys, body limits),
``settings``. The click command is runner/commands/serve.py. Importing this package imports
nothing heavy.
"""
