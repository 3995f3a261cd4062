"""The wire formats: OpenAI's and Ollama's request bodies turned into jobs and results into their
answers, the native job shape and stream, and the one error shape, for every door and client.

Here, at the bottom layer, so the server (HTTP only), ``run batch`` and the endpoint engines of the
pipelines all import one definition. Torch- and web-framework-free. Modules: ``jobspec`` (a job as
data, native job bodies, uploads), ``openai_api`` / ``openai_out`` (OpenAI requests in, responses
out), ``ollama_api``, ``native`` (the stream the ``--server`` client reads), ``errors``.
"""
