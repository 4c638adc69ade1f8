"""In-process CPU engines of the tests: the settings they share, greedy
generation, and plain decoding's reference outputs, computed once a session.

Engines run in the pytest process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the
engine tests read the live proposer's state, and an in-process engine after
the first starts in about 2 s where one in processes of its own imports vLLM
twice more (the CPU platform spawns them; docs/testing.md).
"""

from __future__ import annotations

import gc
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

MAX_TOKENS = 48
ENGINE_MAX_MODEL_LEN = 2048


def engine_kwargs(target, draft=None, spec_extend=None, num_spec_tokens=4,
                  **overrides) -> dict:
    """The CPU engine settings every engine test shares."""
    kwargs = dict(
        model=target,
        dtype="float32",
        enforce_eager=True,
        block_size=32,
        kv_cache_memory_bytes=1 << 30,
        max_model_len=ENGINE_MAX_MODEL_LEN,
        seed=0,
        disable_log_stats=False,
    )
    if draft is not None:
        kwargs["speculative_config"] = {
            "method": "draft_model",
            "model": draft,
            "num_speculative_tokens": num_spec_tokens,
        }
    if spec_extend is not None:
        kwargs["additional_config"] = {"spec_extend": spec_extend}
    kwargs.update(overrides)
    return kwargs


def make_llm(target, draft=None, spec_extend=None, num_spec_tokens=4, **overrides):
    from vllm import LLM

    return LLM(**engine_kwargs(target, draft, spec_extend, num_spec_tokens,
                               **overrides))


def counter(llm, name):
    return sum(m.value for m in llm.get_metrics() if m.name == name)


def greedy(max_tokens=MAX_TOKENS):
    """Greedy sampling for ``max_tokens`` tokens, end of sequence ignored."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def generate(llm, prompts, max_tokens=MAX_TOKENS):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           greedy(max_tokens))
    return [list(o.outputs[0].token_ids) for o in outputs]


def recorded_run(llm, prompts, max_tokens=MAX_TOKENS) -> dict:
    """``llm``'s greedy outputs, every draft its proposer made and its
    SpecExtend counters; the engine is shut down after."""
    from benchmarks.harness.drafter import DraftRecorder, drafter, stats

    recorder = DraftRecorder(llm)
    recorder.enabled = True
    outputs = generate(llm, prompts, max_tokens=max_tokens)
    run = dict(outputs=outputs, proposals=list(recorder.proposals.values()),
               stats=stats(drafter(llm)))
    shutdown(llm)
    return run


def shutdown(llm):
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


_PLAIN: dict[tuple, list[list[int]]] = {}


def plain_reference(target, prompts, max_tokens=MAX_TOKENS):
    """Greedy outputs of plain decoding: what every speculative run must match.
    One engine per target, batch and length in the session: the modules that
    share a batch (``test_lossless``'s, ``test_self_draft_lossless``'s,
    ``test_preemption``'s) share its reference."""
    key = (target, tuple(map(tuple, prompts)), max_tokens)
    if key not in _PLAIN:
        llm = make_llm(target)
        _PLAIN[key] = generate(llm, prompts, max_tokens=max_tokens)
        shutdown(llm)
    return [list(tokens) for tokens in _PLAIN[key]]
