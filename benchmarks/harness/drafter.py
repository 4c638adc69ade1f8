"""Every read or patch of the SpecExtend proposer's internals by benchmarks and
tests, in one place: when the proposer changes, this module is what follows.

Two ways in:

* In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one rank, no worker
  processes): ``drafter(llm)`` is the live proposer, read with ``stats``,
  ``selection_store``/``selections``, ``config``, ``graphs_captured``,
  switched with ``reconfigure``, and timed or recorded by wrapping ``propose``
  (``ProposeTimer``, ``DraftRecorder``), the per-step view preparation
  (``HostTimer``) or the release of finished and preempted requests
  (``ReleaseRecorder``), and probed for what its working sets hold
  (``WorkingSetProbe``).
* Across processes (vLLM's default engine, TP workers): ``worker_state(llm)``
  calls the plugin worker's ``specextend_state`` on every rank (SpecExtend
  engines only). ``install_worker_timers`` / ``take_worker_timings`` put the
  two timers into the workers through ``collective_rpc``; a function travels
  there only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``
  (``WORKER_TIMING_ENV``).
"""

from __future__ import annotations

import time
from typing import NamedTuple

# What ``collective_rpc`` needs to ship a function to an engine core process.
WORKER_TIMING_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


# --------------------------------------------------------------------------- #
# reaching the proposer
# --------------------------------------------------------------------------- #
def model_runner(llm):
    """The model runner of an in-process engine (one rank)."""
    core = llm.llm_engine.engine_core
    inner = getattr(core, "engine_core", None)
    if inner is None:
        raise RuntimeError(
            "the proposer is reachable only in an in-process engine: set "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 before building the LLM, or use "
            "worker_state(llm)"
        )
    worker = getattr(inner.model_executor, "driver_worker", None)
    if worker is None:
        raise RuntimeError(
            "the engine runs its workers in other processes (tensor parallel "
            "or Ray): use worker_state(llm) or collective_rpc"
        )
    return worker.worker.model_runner


def drafter(llm):
    """The live proposer of an in-process engine."""
    return model_runner(llm).drafter


def worker_drafter(worker):
    """The proposer of one worker (in a ``collective_rpc`` function)."""
    return worker.model_runner.drafter


def plugin_proposer(proposer):
    """``proposer`` if it is the plugin's; else an error that names why an
    engine asked for SpecExtend runs vLLM's own drafter."""
    from vllm_specextend.proposer import SpecExtendMixin

    if not isinstance(proposer, SpecExtendMixin):
        raise RuntimeError(
            f"the engine's drafter is vLLM's own {type(proposer).__name__}, not "
            "SpecExtend's: the plugin did not load in this process. vLLM loads "
            "its plugins (the vllm.general_plugins entry point) once a process, "
            "at its first engine: install the plugin before the process starts "
            "(on a GPU host: after benchmarks/realpair/host.sh build, or through "
            "benchmarks/gpu/host_run.sh, which installs it first)")
    return proposer


def stats(proposer) -> dict:
    """The proposer's cumulative counters (device timers resolved)."""
    return plugin_proposer(proposer).stats.snapshot()


class Selection(NamedTuple):
    """One request's selection, read back from the device."""

    window_start: int
    chunks: list[int]
    steps_since_refresh: int


def selection_store(proposer):
    """The per-request selection state: ``len`` counts requests holding a
    selection, iterating gives the requests holding a slot, ``in`` tests one."""
    return plugin_proposer(proposer).state


def selections(proposer) -> dict[str, Selection]:
    """{req_id: Selection} of the requests holding a selection."""
    state = plugin_proposer(proposer).state
    return {
        req_id: Selection(*entry)
        for req_id in state
        if (entry := state.selection(req_id)) is not None
    }


def record_retrievals(proposer, log: list) -> None:
    """Append (slot, window_start, chunk ids) to ``log`` for every selection
    the retriever makes from now on."""
    retrieve = plugin_proposer(proposer).retriever.retrieve
    state = proposer.state

    def recording(request, lens, slots, *args, **kwargs):
        retrieve(request, lens, slots, *args, **kwargs)
        for slot in slots[request.rows]:
            n = int(state.num_selected[slot])
            chunks = state.selected_chunks[slot, :n].tolist()
            log.append((int(slot), int(state.window_start[slot]), chunks))

    proposer.retriever.retrieve = recording


class Held(NamedTuple):
    """What a request held in the proposer's state when it was let go of."""

    selection: bool
    compacted: bool
    """Its scratch run holds copies for compacted positions."""


class ReleaseRecorder:
    """Records every request the worker reports done (finished, aborted or
    preempted) to a proposer: per request id, in order, what it ``Held`` at
    that moment. A finished id is reported once, so an id reported more than
    once was preempted and came back (``resumed``)."""

    def __init__(self, proposer):
        original = plugin_proposer(proposer).on_requests_done
        self.releases: dict[str, list[Held]] = {}

        def recorded(req_ids):
            state = proposer.state
            for req_id in req_ids:
                slot = state.slot_of(req_id)
                held = slot is not None and bool(state.active[slot])
                compacted = slot is not None and bool(state.compacted[slot])
                self.releases.setdefault(req_id, []).append(Held(held, compacted))
            return original(req_ids)

        proposer.on_requests_done = recorded

    def resumed(self) -> dict[str, list[Held]]:
        """{req_id: its releases} of the requests preempted and resumed."""
        return {r: held for r, held in self.releases.items() if len(held) > 1}


def compactor(proposer):
    """The proposer's compactor (compacted positions), or None."""
    return plugin_proposer(proposer).compactor


def graphs_captured(proposer) -> bool:
    """Whether the proposer holds its draft routine per batch size (captured,
    or on static buffers with ``draft_graph: static``)."""
    return plugin_proposer(proposer).capture.graphs is not None


def config(proposer):
    """The proposer's SpecExtendConfig."""
    return plugin_proposer(proposer).cfg


def reconfigure(proposer, spec_extend: dict) -> None:
    """Switch a live proposer to another ``spec_extend`` config (benchmarks
    only: policies and parameters change without an engine start-up)."""
    from vllm_specextend.config import SpecExtendConfig

    plugin_proposer(proposer).reconfigure(SpecExtendConfig.from_dict(spec_extend))


def worker_state(llm) -> list[dict]:
    """Per rank: live request ids, requests holding selection state, and the
    plugin's counters (``stats``). Works in and across processes; fails on an
    engine without the plugin's worker."""
    return llm.collective_rpc("specextend_state")


def stats_delta(before: dict, after: dict) -> dict:
    """Counter growth between two ``stats`` snapshots (gauges left out)."""
    from vllm_specextend.serving.stats import GAUGES

    return {k: after[k] - before[k] for k in after if k not in GAUGES}


# --------------------------------------------------------------------------- #
# timing and recording
# --------------------------------------------------------------------------- #
class ProposeTimer:
    """Times each ``propose`` of a proposer: CUDA events on a GPU (no sync on
    the hot path; ``take_ms`` syncs), wall time on CPU. On while ``enabled``."""

    def __init__(self, proposer):
        import torch

        self.cuda = torch.cuda.is_available()
        self.events: list = []
        self.enabled = False
        original = proposer.propose

        def timed(*args, **kwargs):
            if not self.enabled:
                return original(*args, **kwargs)
            if not self.cuda:
                start = time.perf_counter()
                out = original(*args, **kwargs)
                self.events.append(1000 * (time.perf_counter() - start))
                return out
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = original(*args, **kwargs)
            end.record()
            self.events.append((start, end))
            return out

        proposer.propose = timed

    def take_ms(self) -> list[float]:
        """The times since the last take, in ms."""
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in self.events]
        else:
            times = list(self.events)
        self.events.clear()
        return times


class HostTimer:
    """Host time of SpecExtend's per-step planning (plan, retrieval, the view's
    rows), in ms (no device sync, so on a GPU it is the time to enqueue that
    work)."""

    def __init__(self, proposer):
        self.times: list[float] = []
        self.enabled = False
        original = proposer._plan_view

        def timed(*args, **kwargs):
            if not self.enabled:
                return original(*args, **kwargs)
            start = time.perf_counter()
            result = original(*args, **kwargs)
            self.times.append(1000 * (time.perf_counter() - start))
            return result

        proposer._plan_view = timed

    def take_ms(self) -> list[float]:
        times, self.times = self.times, []
        return times


class WorkingSetProbe:
    """How much of what the target attends to each step's working set holds
    (issue #23). After the plan of every step (``_plan_view``: retrieval done,
    the view's rows known), per drafting row: the scoring layer's attention
    mass per chunk of the last accepted token (``score_layer``: the final
    layer unless set, so compare policies on one scoring layer: CMR holds
    what its own layer ranks highest), scored as the retriever scores
    (``Retriever.chunk_masses``, over the whole context), against the chunks
    the row's view holds (``selection.held_chunks``; a row drafting without a
    view holds them all).

    ``take()`` gives, over the rows and steps since the last take:
    ``row_steps`` (rows drafting, summed over steps),
    ``top_held`` (share whose working set held the chunk with the most mass,
    sinks aside: every policy keeps them, and attention sinks would often win),
    ``mass_held`` (mean share of the mass held). Scores every row every step
    and syncs the device: off (``enabled``) where it is not wanted; draft
    times taken while it is on include it. In-process engines, one rank.
    """

    def __init__(self, proposer):
        original = proposer._plan_view
        self.enabled = False
        self._top: list[bool] = []
        self._mass: list[float] = []

        def probed(cad, token_indices_to_sample, num_rejected):
            step = original(cad, token_indices_to_sample, num_rejected)
            if self.enabled:
                self._probe(proposer, step, cad, token_indices_to_sample, num_rejected)
            return step

        proposer._plan_view = probed

    def _probe(self, proposer, step, cad, token_indices_to_sample, num_rejected):
        import numpy as np
        import torch

        from vllm_specextend.retrieval.selection import held_chunks

        rows_np = np.flatnonzero(step.drafting)
        if not rows_np.size:
            return
        cfg, state = proposer.cfg, proposer.state
        device = cad.seq_lens.device

        def dev(x):
            return torch.as_tensor(np.asarray(x, dtype=np.int64), device=device)

        rows = dev(rows_np)
        if token_indices_to_sample is None:
            query_rows = dev(cad.query_start_loc_cpu[1:].numpy()[rows_np] - 1)
        else:
            query_rows = token_indices_to_sample[rows]
        ctx = cad.seq_lens[rows]
        if num_rejected is not None:
            ctx = ctx - num_rejected[rows]
        mass = proposer.retriever.chunk_masses(
            query_rows, cad.block_table_tensor[rows], ctx,
            int(step.lens.seq[rows_np].max()),
        )  # [n, num_chunks]
        slots, on = step.slots[rows_np], step.params.on[rows_np]
        sink_chunks = cfg.sink_tokens // cfg.chunk_size
        held = held_chunks(
            mass.shape[1], sink_chunks,
            dev(np.where(on, state.window_start[slots] // cfg.chunk_size, 0)),
            state.selected_chunks[step.slots_dev[rows]],
            dev(np.where(on, state.num_selected[slots], 0)),
        )  # [n, num_chunks]
        # Chunks past the last whole one are in every window: never missed.
        missed = (mass * ~held).sum(dim=1)
        beyond_sinks = mass[:, sink_chunks:]
        if beyond_sinks.shape[1]:
            top = beyond_sinks.argmax(dim=1, keepdim=True) + sink_chunks
            self._top += held.gather(1, top)[:, 0].tolist()
        self._mass += (1.0 - missed).tolist()

    def take(self) -> dict | None:
        """The figures since the last take; None if no row drafted."""
        if not self._mass:
            return None
        top, mass, self._top, self._mass = self._top, self._mass, [], []
        return {"row_steps": len(mass),
                "top_held": sum(top) / len(top) if top else None,
                "mass_held": sum(mass) / len(mass)}


_WORKER_TIMERS: dict[int, tuple] = {}


def install_worker_timers(worker) -> bool:
    """For ``collective_rpc``: a ProposeTimer (and, on a SpecExtend proposer,
    a HostTimer) in this worker, on at once. True if the worker drafts."""
    proposer = getattr(worker.model_runner, "drafter", None)
    if proposer is None:
        return False
    host = HostTimer(proposer) if hasattr(proposer, "_plan_view") else None
    propose = ProposeTimer(proposer)
    propose.enabled = True
    if host is not None:
        host.enabled = True
    _WORKER_TIMERS[id(worker)] = (propose, host)
    return True


def take_worker_timings(worker) -> dict:
    """For ``collective_rpc``: {"propose_ms": [...], "prepare_view_ms": [...]}
    since the last take (empty lists where no timer is installed)."""
    propose, host = _WORKER_TIMERS.get(id(worker), (None, None))
    return {"propose_ms": propose.take_ms() if propose else [],
            "prepare_view_ms": host.take_ms() if host else []}


class DraftRecorder:
    """Records every proposal of an in-process drafter per request, in order.

    Only rows whose prompt is fully computed count: during a chunked prefill
    the drafter also runs (to fill its KV) but those proposals are dropped.
    Lengths are read before the drafter runs, as SpecExtendProposer does:
    drafting reuses the runner's buffers. Each step's drafts are copied on
    the device and read back only when ``proposals`` is read, so recording
    leaves async scheduling's overlap as it is (a captured routine returns
    its drafts in a buffer the next step rewrites: hence the copy). Still off
    (``enabled``) while anything is timed: the copy is a kernel per step.
    """

    def __init__(self, llm):
        from vllm_specextend import compat

        runner = model_runner(llm)
        proposer = runner.drafter
        original = proposer.propose
        self._proposals: dict[str, list[list[int]]] = {}
        self._pending: list[tuple[list[str], object, object]] = []
        self.enabled = False

        def recorded(*args, **kwargs):
            if not self.enabled:
                return original(*args, **kwargs)
            num_reqs = runner.input_batch.num_reqs
            req_ids = list(compat.batch_req_ids(runner, num_reqs))
            done = (compat.batch_seq_lens_cpu(runner, num_reqs)
                    >= compat.batch_num_prompt_tokens(runner, num_reqs))
            drafts = original(*args, **kwargs)
            self._pending.append((req_ids, done, drafts.clone()))
            return drafts

        proposer.propose = recorded

    @property
    def proposals(self) -> dict[str, list[list[int]]]:
        """Request id -> its proposals, oldest first (reads the device)."""
        for req_ids, done, drafts in self._pending:
            for req_id, row, keep in zip(req_ids, drafts.tolist(), done, strict=False):
                if keep:
                    self._proposals.setdefault(req_id, []).append(row)
        self._pending.clear()
        return self._proposals

    def take(self, request_id: str) -> list[list[int]]:
        return self.proposals.pop(request_id, [])
