"""compat: the one module that imports vLLM; version pin, touch points, patches."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import background
import pytest
import torch

import vllm_specextend
from vllm_specextend import compat, plugin
from vllm_specextend.compat import model_patches, patches
from vllm_specextend.config import SpecExtendConfig, SpecExtendConfigError
from vllm_specextend.serving import metrics

PKG_DIR = Path(vllm_specextend.__file__).resolve().parent
REPO = PKG_DIR.parent


@pytest.fixture(autouse=True)
def undo_new_patches(tmp_path):
    """Each test starts from the patches applied before it and leaves them so;
    a collector it installs is removed again. Set up before and torn down
    after the test's own ``monkeypatch``, which may set ``_registered``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(metrics.METRICS_DIR_ENV, str(tmp_path / "metrics"))
        before = compat.REGISTRY.applied()
        yield
    metrics.uninstall_collector()
    undone = compat.REGISTRY.undo_since(before)
    if any(p in (patches.ENGINE_ARGS_CLI, patches.ENGINE_ARGS_CONFIG,
                 patches.ENGINE_ARGS_BATCH_DEFAULTS) for p in undone):
        plugin._registered = False


# --- (a) only compat imports vLLM ---------------------------------------------------


def _vllm_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import inside our package
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name == "vllm" or name.startswith("vllm."):
                found.append(f"{path.name}:{node.lineno}: {name}")
    return found


def test_import_scanner_detects_vllm_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\nimport vllm\nfrom vllm.config import X\n"
        "from vllm_specextend import compat\nimport vllm_specextend.drafting.view\n"
        "def f():\n    import vllm.envs as e\n"
    )
    assert len(_vllm_imports(probe)) == 3


def test_only_compat_imports_vllm():
    modules = sorted(PKG_DIR.rglob("*.py"))
    names = {str(p.relative_to(PKG_DIR)) for p in modules}
    assert {"compat/__init__.py", "_dist_alias.py", "config/keys.py",
            "drafting/view.py", "patching.py", "serving/settings.py",
            "worker/gpu.py"} <= names
    compat_dir = PKG_DIR / "compat"
    offenders = []
    for path in modules:
        if compat_dir in path.parents:
            continue
        offenders += _vllm_imports(path)
    assert offenders == []
    assert _vllm_imports(compat_dir / "__init__.py")  # compat really does


def test_dist_alias_pth_only_imports_alias():
    pth = (PKG_DIR / "vllm_specextend_alias.pth").read_text().strip().splitlines()
    assert pth == ["import vllm_specextend._dist_alias"]


def test_dist_alias_keeps_invalidate_caches_working():
    # The alias sits on sys.meta_path as a class; importlib.invalidate_caches()
    # (pytest's syspath_prepend among its callers) calls every finder's unbound.
    import importlib

    import vllm_specextend._dist_alias as alias

    alias.install()
    assert alias.VllmCpuAlias in sys.meta_path
    importlib.invalidate_caches()


# --- (b) pins agree --------------------------------------------------------------------


def test_pyproject_pin_matches_supported():
    text = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r"vllm==([0-9][0-9A-Za-z.+]*)", text)
    assert pins, "no vllm== pin in pyproject.toml"
    assert set(pins) == {compat.SUPPORTED_VLLM}


def test_dockerfile_pin_matches_supported():
    dockerfile = REPO / "docker" / "Dockerfile"
    if not dockerfile.exists():
        pytest.skip("docker/Dockerfile not present")
    text = dockerfile.read_text()
    tags = re.findall(r"^\s*FROM\s+\S*vllm/vllm-openai:v([0-9][0-9A-Za-z.+]*)", text,
                      flags=re.M | re.I)
    assert tags, "no vllm/vllm-openai:v... FROM line"
    assert set(tags) == {compat.SUPPORTED_VLLM}


# --- (c) version check -----------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.26.0", "0.26.0+cpu", "0.26.1", "0.26.0+cu130",
                                     "0.26.2rc1"])
def test_version_check_accepts_026(version, monkeypatch):
    monkeypatch.delenv(compat.SKIP_VERSION_CHECK_ENV, raising=False)
    compat.check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.27.0", "0.25.2", "1.26.0", "0.2.6"])
def test_version_check_rejects_others(version, monkeypatch):
    monkeypatch.setenv(compat.SKIP_VERSION_CHECK_ENV, "0")
    with pytest.raises(RuntimeError) as info:
        compat.check_vllm_version(version)
    assert version in str(info.value)
    assert compat.SUPPORTED_VLLM in str(info.value)


def test_version_check_skip_env_only_warns(monkeypatch):
    warnings = []
    monkeypatch.setenv(compat.SKIP_VERSION_CHECK_ENV, "1")
    monkeypatch.setattr(
        compat.logger, "warning", lambda msg, *args: warnings.append(msg % args)
    )
    compat.check_vllm_version("0.27.0")
    assert len(warnings) == 1
    assert "0.27.0" in warnings[0] and compat.SKIP_VERSION_CHECK_ENV in warnings[0]


def test_version_check_installed():
    import vllm

    compat.check_vllm_version()
    assert compat._release(vllm.__version__)[:2] == (0, 26)


def test_release_parsing():
    assert compat._release("0.26.0+cpu") == (0, 26, 0)
    assert compat._release("0.26.0.dev12+gabc")[:3] == (0, 26, 0)
    # Only major.minor decides; pre-releases and dev builds of 0.26 pass.
    assert compat._release("0.26.1rc2")[:2] == (0, 26)
    compat.check_vllm_version("0.26.1rc2")
    compat.check_vllm_version("0.26.0.dev12+gabc")


# --- (d) touch points -------------------------------------------------------------------


def test_touch_points_match_installed_vllm():
    compat.check_touch_points()


def test_lazy_symbols_resolve():
    for name in compat.LAZY:
        assert isinstance(getattr(compat, name), type), name
    with pytest.raises(AttributeError):
        compat.NoSuchThing  # noqa: B018


# --- (e) dist alias ---------------------------------------------------------------------


def test_dist_alias_reports_cpu_build():
    import vllm_specextend._dist_alias as alias

    version = importlib.metadata.version("vllm")
    assert version.endswith("+cpu")
    assert importlib.metadata.metadata("vllm")["Name"] == "vllm"
    alias.install()
    alias.install()
    assert sum(
        1 for f in sys.meta_path
        if isinstance(f, type) and f.__name__ == "VllmCpuAlias"
    ) == 1


def test_dist_alias_ignores_other_names():
    from importlib.metadata import DistributionFinder

    from vllm_specextend._dist_alias import VllmCpuAlias

    ctx = DistributionFinder.Context(name="torch")
    assert list(VllmCpuAlias.find_distributions(ctx)) == []
    assert VllmCpuAlias.find_spec("vllm") is None


# --- (f) plugin registration ------------------------------------------------------------


def _assert_wrapped_once(fn):
    assert hasattr(fn, "__wrapped__"), fn
    assert not hasattr(fn.__wrapped__, "__wrapped__"), fn


def test_register_is_idempotent(monkeypatch):
    engine_args = compat.EngineArgs
    plugin.register()
    add, create = engine_args.add_cli_args, engine_args.create_engine_config
    plugin.register()
    assert engine_args.add_cli_args is add
    # Even with the module flag reset, the patches apply only once.
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()
    assert engine_args.add_cli_args is add
    assert engine_args.create_engine_config is create
    _assert_wrapped_once(engine_args.add_cli_args)
    _assert_wrapped_once(engine_args.create_engine_config)
    _assert_wrapped_once(engine_args.create_speculative_config)
    _assert_wrapped_once(engine_args._set_default_max_num_seqs_and_batched_tokens_args)
    assert isinstance(engine_args.__dict__["add_cli_args"], staticmethod)


def test_patched_add_cli_args_adds_flag_once():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    plugin.register()
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    assert "--spec-extend" in parser._option_string_actions
    assert "--speculative-model" in parser._option_string_actions
    assert "--num-speculative-tokens" in parser._option_string_actions
    spec = [a for a in parser._actions if "--spec-extend" in a.option_strings]
    assert len(spec) == 1


# --- engine-config hook with a stand-in config -------------------------------------------


def _fake_vllm_config(spec_extend=None, method="draft_model", block_size=16, tp=1,
                      worker_cls="vllm.v1.worker.cpu_worker.CPUWorker",
                      has_spec=True, padded_off=False, max_model_len=4096,
                      draft_max_model_len=4096, num_layers=4):
    spec = (
        types.SimpleNamespace(
            method=method,
            disable_padded_drafter_batch=padded_off,
            draft_model_config=types.SimpleNamespace(
                max_model_len=draft_max_model_len, model="draft"
            ),
            num_speculative_tokens=4,
        )
        if has_spec else None
    )
    extra = {} if spec_extend is None else {"spec_extend": spec_extend}
    return types.SimpleNamespace(
        speculative_config=spec,
        cache_config=types.SimpleNamespace(block_size=block_size, cache_dtype="auto"),
        model_config=types.SimpleNamespace(
            max_model_len=max_model_len, model="target", served_model_name="tiny",
            get_num_layers_by_block_type=lambda parallel, kind: num_layers,
        ),
        parallel_config=types.SimpleNamespace(
            tensor_parallel_size=tp, pipeline_parallel_size=1, worker_cls=worker_cls
        ),
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=8192),
        additional_config=extra,
        use_v2_model_runner=False,
    )


class _DenseEagleConfig:
    """Reads the runner choice as vLLM 0.26 does for a dense model with EAGLE
    on GPU: V2 unless VLLM_USE_V2_MODEL_RUNNER says otherwise."""

    @property
    def use_v2_model_runner(self):
        from vllm import envs

        chosen = envs.VLLM_USE_V2_MODEL_RUNNER
        return True if chosen is None else chosen


def test_v1_runner_is_selected_when_vllm_would_pick_v2(monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    cfg = _DenseEagleConfig()
    assert cfg.use_v2_model_runner
    compat.require_v1_model_runner(cfg)
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert not cfg.use_v2_model_runner
    assert compat.REGISTRY.is_applied(patches.V1_MODEL_RUNNER, os.environ)
    compat.require_v1_model_runner(cfg)  # V1 already: nothing more to patch
    compat.REGISTRY.undo(patches.V1_MODEL_RUNNER, os.environ)
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
    assert cfg.use_v2_model_runner


def test_v2_runner_asked_for_explicitly_is_refused(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(SpecExtendConfigError, match="VLLM_USE_V2_MODEL_RUNNER"):
        compat.require_v1_model_runner(_DenseEagleConfig())
    assert not compat.REGISTRY.is_applied(patches.V1_MODEL_RUNNER, os.environ)


def test_on_engine_config_without_spec_extend_is_noop():
    cfg = _fake_vllm_config(None, method="eagle")
    plugin.on_engine_config(cfg)
    assert cfg.parallel_config.worker_cls == "vllm.v1.worker.cpu_worker.CPUWorker"
    cfg.additional_config = None
    plugin.on_engine_config(cfg)


@pytest.mark.parametrize(
    "platform,ours",
    [
        ("vllm.v1.worker.cpu_worker.CPUWorker", "vllm_specextend.worker.cpu.CPUWorker"),
        ("vllm.v1.worker.gpu_worker.Worker", "vllm_specextend.worker.gpu.GPUWorker"),
    ],
)
def test_on_engine_config_selects_worker(platform, ours):
    cfg = _fake_vllm_config({"top_k": 4}, worker_cls=platform)
    plugin.on_engine_config(cfg)
    assert cfg.parallel_config.worker_cls == ours
    plugin.on_engine_config(cfg)  # already ours: unchanged
    assert cfg.parallel_config.worker_cls == ours
    assert compat.REGISTRY.is_applied(patches.WORKER_CLS, cfg.parallel_config)


def test_worker_qualnames_resolve_as_vllm_resolves_them():
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from vllm_specextend.worker.cpu import CPUWorker
    from vllm_specextend.worker.mixin import SpecExtendWorkerMixin

    for qualname in compat.PLATFORM_WORKERS.values():
        cls = resolve_obj_by_qualname(qualname)
        assert issubclass(cls, SpecExtendWorkerMixin)
        assert qualname.endswith(cls.__name__)
    # The earlier qualname still reaches the same class.
    assert resolve_obj_by_qualname("vllm_specextend.worker.CPUWorker") is CPUWorker


WORKER_IMPORTS = (
    "import sys, vllm_specextend.worker, vllm_specextend.worker.cpu\n"
    "assert 'vllm.v1.worker.cpu_worker' in sys.modules\n"
    "assert 'vllm_specextend.worker.gpu' not in sys.modules\n"
)
# A fresh interpreter importing vLLM: 15-20 s of a core, in the background
# lane (background.py) beside the rest of the suite.
BACKGROUND = {"worker-imports": lambda fixture: lambda: background.run(
    [sys.executable, "-c", WORKER_IMPORTS], timeout=300, stdin=subprocess.DEVNULL)}


def test_worker_package_imports_no_platform_module(request):
    """vLLM imports ``vllm_specextend.worker.<platform>``: importing the package
    or one platform's module must not import the other platform's worker."""
    proc = background.result(request, "worker-imports")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_on_engine_config_rejects_foreign_worker():
    cfg = _fake_vllm_config({}, worker_cls="my.Worker")
    with pytest.raises(SpecExtendConfigError, match="my.Worker"):
        plugin.on_engine_config(cfg)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(has_spec=False), "--speculative-model"),
        (dict(method="ngram"), "ngram"),
        (dict(block_size=64), "--block-size"),
        (dict(padded_off=True), "disable_padded_drafter_batch"),
    ],
)
def test_on_engine_config_validates(kwargs, needle):
    cfg = _fake_vllm_config({}, **kwargs)
    with pytest.raises(SpecExtendConfigError, match=re.escape(needle)):
        plugin.on_engine_config(cfg)
    assert cfg.parallel_config.worker_cls == "vllm.v1.worker.cpu_worker.CPUWorker"


def test_engine_facts_keys_match_engine_facts_dataclass():
    import dataclasses

    from vllm_specextend.config import EngineFacts

    facts = compat.engine_facts(_fake_vllm_config({}))
    assert set(facts) == {f.name for f in dataclasses.fields(EngineFacts)}
    none = compat.engine_facts(_fake_vllm_config({}, has_spec=False))
    assert none["has_speculative_config"] is False and none["method"] is None


@pytest.mark.parametrize("moe, expected", [(False, 1), (True, 2)])
def test_engine_facts_count_data_parallel_ranks_as_the_engines_do(moe, expected):
    """vLLM 0.26's engine cores run a dense target's data parallel ranks as
    independent engines (their data_parallel_size set to 1); an MoE target's
    step together. The API server's facts must say the same, or it resolves
    draft_prompt_pool "auto" otherwise than the engines."""
    cfg = _fake_vllm_config({})
    cfg.parallel_config.data_parallel_size = 2
    cfg.model_config.is_moe = moe
    assert compat.engine_facts(cfg)["data_parallel_size"] == expected


@pytest.mark.parametrize("mrope, xdrope, rows",
                         [(False, 0, 1), (True, 0, 3), (False, 4, 4)])
def test_a_target_with_positions_of_several_rows_pools_nothing(mrope, xdrope, rows):
    """An M-RoPE target (Qwen2-VL's kin) with a text draft: vLLM hands the
    drafter positions of 3 rows, the pooled pass places one row; so "auto"
    resolves to the draft's full pass and says why."""
    from vllm_specextend.config import EngineFacts, resolve_prompt_pool

    cfg = _fake_vllm_config({}, max_model_len=65536, draft_max_model_len=65536)
    cfg.model_config.uses_mrope, cfg.model_config.uses_xdrope_dim = mrope, xdrope
    facts = compat.engine_facts(cfg)
    assert facts["target_position_rows"] == rows
    resolved, note = resolve_prompt_pool(SpecExtendConfig(draft_prompt_pool="auto"),
                                         EngineFacts(**facts))
    if rows == 1:
        assert resolved.draft_prompt_pool == 128
    else:
        assert resolved.draft_prompt_pool is None
        assert f"positions have {rows} rows (M-RoPE or XD-RoPE)" in note


# --- CPU key page order from the real CPU attention kernel ------------------------------


@pytest.mark.parametrize(
    "head_size,block_size,dtype",
    [(64, 16, torch.float32), (128, 32, torch.bfloat16), (32, 16, torch.float16)],
)
def test_cpu_key_order_recovers_keys(head_size, block_size, dtype):
    cpu_attn = pytest.importorskip("vllm.v1.attention.backends.cpu_attn")
    from vllm.v1.attention.backend import AttentionType

    from vllm_specextend.retrieval.scoring import gather_keys

    # The impl's constructor wants a live vLLM config; set what do_kv_cache_update reads.
    impl = object.__new__(cpu_attn.CPUAttentionBackendImpl)
    impl.attn_type = AttentionType.DECODER
    impl.kv_cache_dtype = "auto"
    impl.head_size = head_size
    try:
        impl.isa = cpu_attn._get_attn_isa(dtype, block_size, head_size, "auto")
    except Exception as e:  # pragma: no cover - platform specific
        pytest.skip(f"no CPU attention ISA here: {e}")
    layer = types.SimpleNamespace(
        impl=impl, head_size=head_size, _k_scale_float=1.0, _v_scale_float=1.0
    )
    order = compat.cpu_key_order(layer, block_size, dtype)
    assert sorted(order.tolist()) == list(range(block_size * head_size))

    num_blocks, hkv = 3, 2
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(num_blocks * block_size, hkv, head_size, generator=gen).to(dtype)
    value = torch.randn(num_blocks * block_size, hkv, head_size, generator=gen).to(dtype)
    cache = torch.zeros(num_blocks, hkv, block_size, 2 * head_size, dtype=dtype)
    impl.do_kv_cache_update(layer, key, value, cache, torch.arange(len(key)))
    blocks = torch.tensor([2, 0, 1])
    got = gather_keys(cache, blocks, head_size, order)
    want = key.view(num_blocks, block_size, hkv, head_size).permute(0, 2, 1, 3)[blocks]
    assert torch.equal(got, want)


# --- declared patches -----------------------------------------------------------


def test_declared_patches():
    """Every change to vLLM's behaviour, by name; adding one means declaring it
    here, in ``compat.patches.PATCHES`` and in the touch-point table."""
    assert [p.name for p in compat.PATCHES] == [
        "EngineArgs.add_cli_args",
        "EngineArgs.create_engine_config",
        "EngineArgs.batch_defaults",
        "sys.excepthook",
        "env.VLLM_USE_V2_MODEL_RUNNER",
        "additional_config_action.__class__",
        "middleware_action.__class__",
        "ParallelConfig.worker_cls",
        "Attention.impl.forward",
        "GPUModelRunner.effective_drafter_max_model_len",
        "RotaryEmbedding.cos_sin_cache",
        "Attention.kv_cache",
        "GPUModelRunner.kv_caches",
        "GPUModelRunner._sample",
        "parallel_state._TP",
        "KernelParam.do_not_specialize",
        "CPUAttentionMetadataBuilder.num_heads",
    ]
    table = compat.__doc__
    for patch in compat.PATCHES:
        assert f"``{patch.name}``" in table, patch.name
        assert len(patch.why) > 60 and patch.target, patch.name
    assert [p.name for p in compat.PATCHES if not p.undoable] == [
        "Attention.kv_cache", "GPUModelRunner.kv_caches"
    ]


def test_registry_refuses_undeclared_patches():
    from vllm_specextend.patching import Patch, PatchError

    stray = Patch(name="X.y", target="X.y", why="test", attrs=("y",),
                  replace=lambda owner: {"y": 1})
    with pytest.raises(PatchError, match="not in the declared"):
        compat.REGISTRY.apply(stray, types.SimpleNamespace(y=0))


def test_query_capture_wraps_one_impl_once():
    calls, seen = [], []

    class Impl:
        def forward(self, layer, query, scale=1):
            calls.append((layer, query, scale))
            return query * scale

    impl, other = Impl(), Impl()
    layer = types.SimpleNamespace(impl=impl)
    compat.wrap_query_capture(layer, seen.append)
    compat.wrap_query_capture(layer, seen.append)  # once per impl
    assert impl.forward("L", 3, scale=2) == 6
    assert seen == [3] and calls == [("L", 3, 2)]
    assert other.forward("L", 4) == 4 and seen == [3], "other instances untouched"
    compat.REGISTRY.undo(patches.QUERY_CAPTURE, impl)
    assert "forward" not in vars(impl)
    impl.forward("L", 5)
    assert seen == [3]


def test_long_drafts_patch_needs_the_runner_attribute():
    from vllm_specextend.patching import PatchError

    runner = types.SimpleNamespace(max_model_len=4096,
                                   effective_drafter_max_model_len=256)
    compat.allow_long_drafts(runner)
    assert runner.effective_drafter_max_model_len == 4096
    compat.REGISTRY.undo(patches.LONG_DRAFTS, runner)
    assert runner.effective_drafter_max_model_len == 256
    # A renamed upstream attribute fails instead of adding one nobody reads.
    with pytest.raises(PatchError, match="effective_drafter_max_model_len"):
        compat.allow_long_drafts(types.SimpleNamespace(max_model_len=4096))


class _FakeRunner:
    """What EARLY_OUTPUT_COPY reads of vLLM's runner: sampling, the output copy
    stream, and the two flags whose snapshots follow the drafter."""

    routed_experts_initialized = False
    check_ep_fault = False

    def __init__(self):
        self.stream = object()

    def _sample(self, logits, spec_decode_metadata):
        return ("sampled", logits)

    def _get_or_create_async_output_copy_stream(self):
        return self.stream


def test_early_output_copy_waits_for_sampling_once_per_step(monkeypatch):
    order = []

    class Event:
        def record(self):
            order.append(("record", self))

    monkeypatch.setattr(model_patches.torch.cuda, "Event", Event)
    monkeypatch.setattr(model_patches, "_AfterSampling",
                        lambda stream, event: ("after", stream, event))
    runner = _FakeRunner()
    compat.copy_outputs_after_sampling(runner)
    compat.copy_outputs_after_sampling(runner)  # once per runner
    assert runner._sample("L", None) == ("sampled", "L")
    (_, event), = order
    # The step's output copy waits for that event, on the runner's own stream.
    assert runner._get_or_create_async_output_copy_stream() == ("after", runner.stream, event)
    # Without a new sampling (a pooling output, say) the stream is vLLM's own.
    assert runner._get_or_create_async_output_copy_stream() is runner.stream
    # Routed experts are snapshotted after the drafter: the whole stream.
    runner._sample("L", None)
    runner.routed_experts_initialized = True
    assert runner._get_or_create_async_output_copy_stream() is runner.stream
    compat.REGISTRY.undo(patches.EARLY_OUTPUT_COPY, runner)
    assert "_sample" not in vars(runner)
    assert "_get_or_create_async_output_copy_stream" not in vars(runner)


def test_on_engine_config_exports_metrics_only_when_enabled():
    from prometheus_client import REGISTRY, generate_latest

    plugin.on_engine_config(_fake_vllm_config(None))
    assert b"vllm:spec_extend_" not in generate_latest(REGISTRY)
    plugin.on_engine_config(_fake_vllm_config({}))
    text = generate_latest(REGISTRY).decode()
    assert 'vllm:spec_extend_retrievals_total{engine="0",model_name="tiny"} 0.0' in text
    assert 'vllm:spec_extend_tracked_requests{engine="0",model_name="tiny"} 0.0' in text


def test_on_engine_config_rejects_a_score_layer_past_the_target():
    # Caught with the engine config, before any worker loads a model.
    cfg = _fake_vllm_config({"score_layer": 4}, num_layers=4)
    with pytest.raises(SpecExtendConfigError, match=r"outside the target's 4 attention layers"):
        plugin.on_engine_config(cfg)
    assert compat.engine_facts(cfg)["num_target_attention_layers"] == 4
    plugin.on_engine_config(_fake_vllm_config({"score_layer": -4}, num_layers=4))


def _attention_layers(monkeypatch, layers: dict):
    import vllm.config

    monkeypatch.setattr(vllm.config, "get_layers_from_vllm_config",
                        lambda vllm_config, kind: dict(layers))


def test_target_attention_indexes_layers_in_model_order(monkeypatch):
    # Listed out of order, with a draft layer that shares the forward context.
    names = [f"model.layers.{i}.self_attn.attn" for i in (10, 2, 0, 11, 1)]
    layers = {n: types.SimpleNamespace(name=n, sliding_window=None) for n in names}
    layers["draft.layers.0.self_attn.attn"] = types.SimpleNamespace(name="draft")
    _attention_layers(monkeypatch, layers)
    exclude = {"draft.layers.0.self_attn.attn"}

    def pick(index):
        return compat.target_attention(None, exclude, SpecExtendConfig(score_layer=index))

    # By layer number, not by name: layer 10 comes after 2 (a string sort
    # would put it at index 2).
    assert [(i, n, layer.name.split(".")[2]) for i, n, layer in map(pick, (0, 2, 3, -1, -5))] == [
        (0, 5, "0"), (2, 5, "2"), (3, 5, "10"), (4, 5, "11"), (0, 5, "0")]
    with pytest.raises(SpecExtendConfigError, match="outside the target's 5 attention layers"):
        pick(5)


def test_target_attention_refuses_a_sliding_window_layer(monkeypatch):
    layers = {f"model.layers.{i}.self_attn.attn":
              types.SimpleNamespace(sliding_window=4096 if i % 2 else None) for i in range(4)}
    _attention_layers(monkeypatch, layers)
    assert compat.target_attention(None, set(), SpecExtendConfig(score_layer=2))[0] == 2
    with pytest.raises(SpecExtendConfigError, match="sliding-window layer .4096 tokens.; choose"):
        compat.target_attention(None, set(), SpecExtendConfig(score_layer=-1))


def test_draft_tp_group_stands_in_for_the_tp_group_only_inside():
    # A replicated draft is built and run against a one-rank group, while the
    # plugin's own collectives (chunk scores, the selection) keep the target's.
    from vllm.distributed import get_tp_group, parallel_state

    target = types.SimpleNamespace(rank_in_group=1, world_size=2)
    draft = types.SimpleNamespace(rank_in_group=0, world_size=1)
    saved = parallel_state._TP
    parallel_state._TP = target
    try:
        with compat.draft_tp_group(draft):
            assert get_tp_group() is draft
            assert compat.tp_rank_and_size() == (1, 2)
            with compat.draft_tp_group(draft):  # nested: the outer state stays
                assert get_tp_group() is draft
            assert get_tp_group() is draft
            assert compat.REGISTRY.is_applied(patches.DRAFT_TP_GROUP, parallel_state)
        assert get_tp_group() is target
        assert not compat.REGISTRY.is_applied(patches.DRAFT_TP_GROUP, parallel_state)
        with compat.draft_tp_group(None):  # sharded: nothing changes
            assert get_tp_group() is target
        with pytest.raises(RuntimeError), compat.draft_tp_group(draft):
            raise RuntimeError("a failing draft forward")
        assert get_tp_group() is target and compat.tp_rank_and_size() == (1, 2)
    finally:
        parallel_state._TP = saved


@pytest.mark.parametrize("placement, tp, resolved", [
    (None, 1, "sharded"), (None, 4, "sharded"), ("replicated", 4, "replicated"),
    ("sharded", 2, "sharded"),
])
def test_resolved_draft_placement_goes_into_the_hashed_config(placement, tp, resolved):
    # vLLM 0.26 keys its compile cache by the config's hash, not the traced
    # graph: a sharded draft's cached pieces must never serve a replicated one.
    spec_extend = {"top_k": 4} if placement is None else {
        "top_k": 4, "draft_placement": placement}
    cfg = _fake_vllm_config(spec_extend, tp=tp)
    plugin.on_engine_config(cfg)
    assert cfg.additional_config["spec_extend"] == {"top_k": 4,
                                                   "draft_placement": resolved}


# vLLM 0.26's default capture sizes for a largest size of 512.
_SIZES_512 = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


@pytest.mark.parametrize("mode, k, eager, expected", [
    ("FULL_AND_PIECEWISE", 12, False, 507),  # multiples of 13 up to 512
    ("FULL_AND_PIECEWISE", 4, False, 500),
    ("PIECEWISE", 12, False, 512),  # no full decode graphs: no rounding
    ("NONE", 12, False, None),
    ("FULL_DECODE_ONLY", 12, False, None),  # the drafter gets no graphs there
    ("FULL_AND_PIECEWISE", 12, True, None),
])
def test_draft_graph_tokens_follow_vllms_spec_decode_rounding(mode, k, eager, expected):
    """The largest draft forward that replays a CUDA graph is what vLLM's
    worker leaves after rounding the capture sizes to multiples of K + 1:
    a pool fill of 16 chunks (512 tokens) at K = 12 would run eagerly."""
    from vllm.config import CompilationConfig, CUDAGraphMode

    cfg = _fake_vllm_config({})
    cfg.speculative_config.num_speculative_tokens = k
    cfg.model_config.enforce_eager = eager
    cfg.compilation_config = CompilationConfig(
        cudagraph_mode=getattr(CUDAGraphMode, mode),
        cudagraph_capture_sizes=list(_SIZES_512), max_cudagraph_capture_size=512)
    assert compat.engine_facts(cfg)["draft_graph_tokens"] == expected
    # A copy rounded: the engine's own sizes stay for its worker to round.
    assert cfg.compilation_config.max_cudagraph_capture_size == 512
    assert cfg.compilation_config.cudagraph_capture_sizes == _SIZES_512
