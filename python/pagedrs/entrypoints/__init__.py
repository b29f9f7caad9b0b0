"""Entry points over the engine: the OpenAI-compatible HTTP server."""
