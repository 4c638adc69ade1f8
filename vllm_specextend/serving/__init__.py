"""Serving: the plugin as an engine's user meets it.

The ``--spec-extend`` flag and its aliases (``cli``), one engine's resolved
settings (``settings``), counters and the log line (``stats``), their
snapshots in a private directory (``snapshots``) and ``/metrics``
(``metrics``), the API-key middleware (``auth``; deployments
name it as ``vllm_specextend.auth``) and async scheduling by default
(``scheduling``). Imports nothing of ``drafting`` or ``retrieval``; nothing is
re-exported here.
"""
