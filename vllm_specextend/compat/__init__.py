"""Every touch point on vLLM internals, in one package (vLLM 0.26).

==================================================  ==========  =======================================
vLLM symbol                                         how         why
==================================================  ==========  =======================================
``vllm.__version__``                                read        pin check
``EngineArgs.add_cli_args``                         patch       add ``--spec-extend`` and aliases
``EngineArgs.create_engine_config``                 patch       validate, select our worker class
``EngineArgs.batch_defaults``                       patch       a step's budget as without drafts
``sys.excepthook``                                  patch       engine-time config errors in one line
``additional_config_action.__class__``              patch       merge ``--additional-config``
``middleware_action.__class__``                     patch       ``--middleware``: API key at parse time
``AuthenticationMiddleware.verify_token``           subclass    the API key's token check (``auth``)
argparse ``_option_string_actions``                 read        an option's action, by flag
``VllmConfig.additional_config``                    read        carries ``spec_extend``
``ParallelConfig.worker_cls``                       patch       platform worker -> ours
``VllmConfig.use_v2_model_runner``                  read        our drafters are the V1 runner's;
``env.VLLM_USE_V2_MODEL_RUNNER``                    patch       EAGLE on a dense model defaults to V2
``served_model_name``, DP rank                      read        /metrics labels, as vLLM's
``envs.disable_envs_cache``                         call        a test's engines read the env it sets
``batch_invariant._batch_invariant_MODE``           read        a test's kernels are batch-invariant
``v1.worker.gpu_worker.Worker``                     subclass    install the proposer (GPU)
``v1.worker.cpu_worker.CPUWorker``                  subclass    install the proposer (CPU)
``Worker.init_device`` / ``.execute_model``         override    runner exists / finished req ids
``GPUModelRunner.drafter`` / ``.input_batch``       write/read  our proposer; row -> req_id
``GPUModelRunner._is_all_reqs_chunked_prefill``    call        steps that sample no row (deferral)
``GPUModelRunner.discard_request_mask``             read        rows that sample nothing (split pass)
``ubatch_utils.split_attn_metadata``                call        a step's rows cut in two (split pass)
``SchedulerOutput.kv_cache_block_copies``          read        kept draft passes before block copies
``GPUModelRunner.input_ids`` / ``.positions``       share       self_draft: graphs' input addresses
``DraftModelProposer`` / ``EagleProposer``          subclass    draft_model / eagle(3) proposers
``  .propose``                                      override    retrieval + view per step
``  .build_per_group_and_layer_attn_metadata``      override    funnel of every draft forward
``  .load_model``                                   override    hook the scoring target layer
``CommonAttentionMetadata`` fields                  read/copy   block table, seq lens, qsl
``Attention.impl.forward``                          patch       capture the scoring layer's query
``Attention.kv_cache`` / ``impl.scale``             read        paged keys for scoring
``ops.cpu_attn_reshape_and_cache``                  call        learn the CPU key page order
``Worker.determine_available_memory``               override    KV budget less the scratch blocks
``Attention.get_kv_cache_spec``                     call        draft KV bytes per block
``kv_cache_utils.max_memory_usage_bytes``           call        one request's KV (budget check)
``Worker.initialize_from_config``                   override    KV allocated: add scratch blocks
``Worker.compile_or_warm_up_model``                 override    after vLLM's capture: the draft routine
``  ._determine_batch_execution_and_padding``       override    no nested graphs inside the capture
``CommonAttentionMetadata``                         build       static inputs of the captured routine
``InputBatch.block_table[g].block_table.gpu``       read        the table width the graphs are sized to
``AttentionGroup.get_metadata_builder``             read        FlashAttention: capturable drafting
EAGLE-3 ``model.fc.input_size``                     read        width of the head's static input
``  ._greedy_sample``                               override    the greedy draft token (Triton argmax)
``FlashAttentionMetadata.max_num_splits``           write       the draft's split count (tuning)
``fa_utils.get_scheduler_metadata``                call        AOT split schedule of captured drafts
``Attention.kv_cache``                              patch       draft layers' KV with scratch blocks
``GPUModelRunner.kv_caches``                        patch       ... and the runner's list of them
``GPUModelRunner.effective_drafter_max_model_len``  patch       drafts past the draft's length
``GPUModelRunner._sample`` / output copy stream     patch       tokens copied out before the draft pass
``RotaryEmbedding.cos_sin_cache``                   patch       draft RoPE table to the target's length
``RotaryEmbedding._compute_inv_freq``               call        frequencies for re-rotation
``distributed`` TP rank, all-reduce, broadcast      call        one chunk choice across TP ranks
``parallel_state.graph_capture``                    call        draft routine's collectives captured
``parallel_state._TP``                              patch       a replicated draft's one-rank TP group
``KernelParam.do_not_specialize``                   patch       spec-decode kernels: one compile a shape
``CPUAttentionMetadataBuilder.num_heads``           patch       CPU draft attention: the draft's own heads
``copy_and_expand_eagle_inputs_kernel``             call        compiled per block at warm-up
``update_num_computed_tokens_for_batch_change``     call        compiled per batch-size pair at warm-up
==================================================  ==========  =======================================

Each ``patch`` row is a declared patch in ``compat.patches`` (``PATCHES``),
which says in full what it changes and why. Modules: ``symbols`` (the logger,
vLLM classes loaded on first use), ``engine`` (engine-config reads),
``args`` (CLI parser reads), ``runner`` (batch reads), ``layers`` (attention
and RoPE layers), ``kv`` (KV layout and scratch blocks), ``distributed``
(TP group), ``graphs`` (the captured routine's needs), ``warmup`` (kernels
compiled early), ``patches`` (declared in ``startup_patches`` and
``model_patches``) and ``allreduce_fusion`` (a vLLM compilation setting,
imported by ``plugin`` only). Version-specific notes carry a ``vLLM 0.26:`` tag.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import vllm

from vllm_specextend.compat.args import has_option, option_action
from vllm_specextend.compat.distributed import (
    capture_stream,
    draft_tp_group,
    one_rank_tp_group,
    tp_all_reduce,
    tp_broadcast,
    tp_rank_and_size,
)
from vllm_specextend.compat.engine import (
    additional_config,
    attention_row_limit,
    batch_invariant_on,
    engine_facts,
    engine_index,
    engine_indexes,
    executor_supports_async,
    is_cpu_platform,
    log_stats_interval,
    max_num_batched_tokens,
    max_num_seqs,
    reread_env,
    served_model_name,
)
from vllm_specextend.compat.graphs import (
    block_table_width,
    decode_attn_metadata,
    draft_graph_blocker,
    eagle_input_width,
    schedule_draft_attention,
    set_attn_splits,
)
from vllm_specextend.compat.kv import (
    PADDING_SLOT_ID,
    add_kv_blocks,
    cpu_key_order,
    kv_block_bytes,
    layer_kv_cache,
    one_request_kv_bytes,
)
from vllm_specextend.compat.layers import (
    attention_layer,
    kv_cache_layer_names,
    lm_head_rows,
    rope_inv_freq,
    rotary_embeddings,
    target_attention,
)
from vllm_specextend.compat.warmup import (
    warm_up_batch_change,
    warm_up_input_copies,
    warm_up_spec_decode_kernels,
)
from vllm_specextend.compat.patches import (
    PATCHES,
    PLATFORM_WORKERS,
    REGISTRY,
    allow_long_drafts,
    apply_process_patches,
    compile_once_per_step_shape,
    copy_outputs_after_sampling,
    draft_attention_heads,
    extend_rope,
    report_errors_briefly,
    require_v1_model_runner,
    select_worker_cls,
    undo_process_patches,
    wrap_option_action,
    wrap_query_capture,
)
from vllm_specextend.compat.runner import (
    batch_num_prompt_tokens,
    batch_req_ids,
    batch_seq_lens_cpu,
    copies_kv_blocks,
    discarded_rows,
    live_req_ids,
    model_input_buffers,
    prefill_deferral_blocker,
    row_token_ids,
    samples_no_row,
    split_rows,
)
from vllm_specextend.compat.startup_patches import BatchDefaults
from vllm_specextend.compat.symbols import LAZY, load, logger

__all__ = [
    "BatchDefaults", "LAZY", "PADDING_SLOT_ID", "PATCHES", "PLATFORM_WORKERS", "REGISTRY",
    "SKIP_VERSION_CHECK_ENV",
    "SUPPORTED_VLLM", "add_kv_blocks", "additional_config", "allow_long_drafts",
    "apply_process_patches", "attention_layer", "capture_stream", "batch_num_prompt_tokens", "row_token_ids",
    "batch_req_ids", "batch_seq_lens_cpu", "block_table_width",
    "check_touch_points", "copy_outputs_after_sampling", "decode_attn_metadata",
    "draft_attention_heads",
    "draft_graph_blocker", "compile_once_per_step_shape",
    "warm_up_batch_change", "warm_up_input_copies", "warm_up_spec_decode_kernels",
    "schedule_draft_attention",
    "eagle_input_width", "set_attn_splits",
    "check_vllm_version", "cpu_key_order", "engine_facts",
    "engine_index", "engine_indexes", "extend_rope", "has_option",
    "executor_supports_async", "is_cpu_platform", "kv_block_bytes",
    "kv_cache_layer_names",
    "target_attention",
    "layer_kv_cache", "live_req_ids", "lm_head_rows", "load", "log_stats_interval", "logger",
    "max_num_batched_tokens", "max_num_seqs", "reread_env", "batch_invariant_on",
    "attention_row_limit",
    "copies_kv_blocks", "model_input_buffers", "prefill_deferral_blocker",
    "samples_no_row", "discarded_rows", "split_rows",
    "one_request_kv_bytes", "option_action", "report_errors_briefly",
    "require_v1_model_runner", "rope_inv_freq", "rotary_embeddings",
    "select_worker_cls", "served_model_name", "tp_all_reduce", "tp_broadcast",
    "tp_rank_and_size", "undo_process_patches", "wrap_option_action",
    "wrap_query_capture",
]

SUPPORTED_VLLM = "0.26.0"
SKIP_VERSION_CHECK_ENV = "SPECEXTEND_SKIP_VERSION_CHECK"


def __getattr__(name: str) -> Any:
    """``compat.DraftModelProposer``, ``compat.GPUWorkerBase``, ...: see
    ``symbols.LAZY``; imported on first use."""
    return load(name)


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_vllm_version(installed: str | None = None) -> None:
    """Refuse any vLLM but 0.26.x (local ``+cpu``/``+cu130`` builds pass)."""
    installed = installed or vllm.__version__
    if _release(installed)[:2] == _release(SUPPORTED_VLLM)[:2]:
        return
    message = (
        f"vllm-specextend supports vLLM {SUPPORTED_VLLM} (0.26.x); installed: "
        f"{installed}. Install vllm=={SUPPORTED_VLLM} or a matching vllm-specextend."
    )
    if os.environ.get(SKIP_VERSION_CHECK_ENV) == "1":
        logger.warning("%s Continuing because %s=1.", message, SKIP_VERSION_CHECK_ENV)
        return
    raise RuntimeError(message)


_TOUCH_POINTS = {
    "DraftModelProposer.propose": (
        "common_attn_metadata",
        "token_indices_to_sample",
        "num_rejected_tokens_gpu",
    ),
    "DraftModelProposer.build_per_group_and_layer_attn_metadata": (
        "common_attn_metadata",
        "draft_index",
    ),
    "DraftModelProposer.load_model": ("target_model",),
    "EagleProposer.propose": ("common_attn_metadata", "num_rejected_tokens_gpu"),
    "EagleProposer.build_per_group_and_layer_attn_metadata": (
        "common_attn_metadata",
        "draft_index",
    ),
    "GPUWorkerBase.init_device": (),
    "GPUWorkerBase.determine_available_memory": (),
    "GPUWorkerBase.initialize_from_config": ("kv_cache_config",),
    "GPUWorkerBase.execute_model": ("scheduler_output",),
    "GPUWorkerBase.compile_or_warm_up_model": (),
    "DraftModelProposer._greedy_sample": ("hidden_states",),
    "DraftModelProposer._determine_batch_execution_and_padding": (
        "num_tokens",
        "use_cudagraphs",
    ),
    "GPUModelRunner._sample": ("logits", "spec_decode_metadata"),
    "GPUModelRunner._get_or_create_async_output_copy_stream": (),
    "GPUModelRunner._is_all_reqs_chunked_prefill": (),
    "EngineArgs.add_cli_args": ("parser",),
    "EngineArgs.create_engine_config": ("usage_context",),
}
_CAD_FIELDS = (
    "block_table_tensor",
    "seq_lens",
    "seq_lens_cpu_upper_bound",
    "query_start_loc",
    "query_start_loc_cpu",
    "max_seq_len",
    "_seq_lens_cpu",
    "_num_computed_tokens_cpu",
    "_num_computed_tokens_cache",
)


def check_touch_points() -> None:
    """Fail loudly if an overridden or read vLLM name moved or changed."""
    problems = []
    for qualname, params in _TOUCH_POINTS.items():
        owner, attr = qualname.split(".")
        fn = getattr(load(owner), attr, None)
        if fn is None:
            problems.append(f"{qualname} is missing")
            continue
        missing = set(params) - set(inspect.signature(fn).parameters)
        if missing:
            problems.append(f"{qualname} lacks parameters {sorted(missing)}")
    fields = {f.name for f in dataclasses.fields(load("CommonAttentionMetadata"))}
    for name in _CAD_FIELDS:
        if name not in fields:
            problems.append(f"CommonAttentionMetadata.{name} is missing")
    if problems:
        raise RuntimeError(
            "vllm-specextend does not match the installed vLLM internals: "
            + "; ".join(problems)
        )
