"""Drafting: how the draft model runs over a long context.

The block-table view the draft reads through (``view``, ``host_step``), the
captured draft routine (``draft_graph``, ``draft_capture``), compacted
positions (``compactor``, ``rope``, ``scratch``), the draft's passes over a
prompt (``prompt_pool``, ``pooled_passes``, ``kept_passes``, ``deferral``),
the kinds of drafter (``separate_draft``, ``self_draft``, ``replicated``),
what the worker calls on it (``worker_hooks``) and its switches
(``draft_vocab``, ``tuning``, ``argmax_triton``, ``reconfigure``).
``proposer`` composes them. Nothing is re-exported here, so importing the
package loads none of its modules.
"""
