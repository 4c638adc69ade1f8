"""Serving: the plugin as an engine's user meets it.

The ``--spec-extend`` flag and its aliases (``cli``), one engine's resolved
settings (``settings``), counters, the log line and ``/metrics`` (``stats``,
``metrics_dir``, ``metrics``), the API-key middleware (``auth``; deployments
name it as ``vllm_specextend.auth``) and async scheduling by default
(``scheduling``). Imports nothing of ``drafting`` or ``retrieval``; nothing is
re-exported here.
"""
