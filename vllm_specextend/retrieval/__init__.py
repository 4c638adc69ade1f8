"""Retrieval: which chunks of a long context the draft gets to see.

Scoring the chunks by the target's attention (``scoring``,
``scoring_triton``), choosing them (``selection``), the retriever that runs
both each step (``retriever``), the per-request selection store
(``state``), the step's plan of which rows score (``planner``) and the host
arrays a step stages to the device (``staging``). Imports nothing of
``drafting``; nothing is re-exported here.
"""
