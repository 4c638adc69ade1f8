"""vLLM's own ``suffix`` mode (SuffixDecoding) in the real-pair grid: the
arctic-inference package it needs, kept apart from the other modes.

vLLM 0.26's ``vllm/v1/spec_decode/suffix_decoding.py`` imports
``arctic_inference.suffix_decoding.SuffixDecodingCache`` (a C++ suffix tree,
CPU only). ``arctic_wheel.sh`` builds that part as a CPython 3.12 wheel,
``prepare.sh`` puts it in ``.gpu/pair/kit/``, ``host.sh build`` installs it
into its own folder (``/root/arctic``) and ``grid.sh`` puts that folder on
the path of the ``suffix`` mode only: the other modes never see the package.

A full arctic-inference install registers a vLLM general plugin
(``arctic_inference.vllm.plugin``) that patches vLLM; ``SUFFIX_ENV`` makes
vLLM load only this project's plugin, as in every other mode, so the mode
runs vLLM's suffix method as vLLM ships it (the wheel built here has no such
plugin at all).

    python -m benchmarks.realpair.arctic check   # the wheel's check (arctic_wheel.sh)
"""

from __future__ import annotations

import sys

SUFFIX_ENV = {"VLLM_PLUGINS": "specextend", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
"""The ``suffix`` mode's environment: vLLM loads only the general plugins
``VLLM_PLUGINS`` names (``vllm/plugins/__init__.py``), here this project's
(``specextend``, as loaded in every mode), never ``arctic_inference``; and
``collective_rpc`` may send a function to the workers (``empty_responses``:
a benchmark's control message, nothing a request carries)."""


def evict_responses(worker) -> int:
    """On a worker: every cached response out of vLLM's suffix proposer's
    cache (``SuffixDecodingCache``); how many there were."""
    cache = worker.model_runner.drafter.suffix_cache
    cached = list(cache.cached_requests)
    for req_id in cached:
        cache.evict_cached_response(req_id)
    return len(cached)


def empty_responses(llm) -> int:
    """SuffixDecoding's responses of earlier requests out of ``llm``'s
    workers, so that a cell's prompts are fresh to it as to every mode.
    Why: it keeps up to 10,000 requests' responses (vLLM's default) and
    drafts from them; a cell whose prompts an earlier cell answered (batch 8
    after batch 1) would draft from their own answers (2026-12-06, 1636Z:
    accepted length 7.34 at batch 8 against 3.85 for the same prompts at
    batch 1). Returns the responses evicted (rank 0's)."""
    return llm.collective_rpc(evict_responses)[0]

FIX = ("run benchmarks/realpair/prepare.sh here (it builds "
       ".gpu/pair/kit/arctic_inference-*.whl), then host.sh build on the host "
       "(it installs the wheel into /root/arctic, which grid.sh puts on the "
       "suffix mode's path)")


def missing() -> str | None:
    """None when vLLM's suffix method can import what it needs, else one
    line that names the fix."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError as e:
        return f"suffix mode: arctic_inference is not importable ({e}): {FIX}"
    return None


def installed() -> dict:
    """The arctic_inference the mode runs with: version and folder (meta)."""
    from importlib.metadata import version

    import arctic_inference

    return {"version": version("arctic_inference"),
            "path": str(arctic_inference.__path__[0])}


def round_trip() -> list[int]:
    """What vLLM's proposer does, in small: a prompt into a
    ``SuffixDecodingCache``, a sampled token appended, a draft from the
    prompt's suffix tree; the draft's token ids."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=4)
    cache.start_request("r", [7, 1, 2, 3, 4, 5, 6, 9, 8, 1, 2, 3, 4])
    cache.add_active_response("r", [5])
    draft = cache.speculate("r", [1, 2, 3, 4, 5], max_spec_tokens=4)
    cache.stop_request("r")
    return list(draft.token_ids)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["check"]:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    problem = missing()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    draft = round_trip()
    if draft != [6, 9, 8, 1]:
        print(f"SuffixDecodingCache drafted {draft}, not [6, 9, 8, 1]", file=sys.stderr)
        return 1
    info = installed()
    print(f"arctic_inference {info['version']} ({info['path']}): "
          f"SuffixDecodingCache drafted {draft} after [1, 2, 3, 4, 5]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
