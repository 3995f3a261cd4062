"""`run serve`: one warm process behind OpenAI-, Ollama- and taskrun-native HTTP APIs.

Modules: ``command`` (the click command), ``app`` (the FastAPI app factory), ``openai_api`` /
``openai_out`` (OpenAI request and response shapes, shared with ``run batch``), ``ollama_api``,
``native`` (``/v1/tasks/{task}``), ``wire`` (the native streaming format the ``--server`` client
reads), ``workers`` (per-model queues and threads), ``batching`` (dynamic batching of embeddings),
``metrics`` (Prometheus), ``security`` (keys, body limits), ``errors`` (the error shape).
Importing this package imports nothing heavy.
"""
