"""OpenAI-compatible server: ``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``, ``/health``, ``/metrics``. Build it with ``api_server.build_app``
or run ``pagedrs serve MODEL``."""
