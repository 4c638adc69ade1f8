"""How a serving result's rows are named and grouped, for ``bench_serve``'s
tables and ``plot_serve``'s plots alike: a row's series (its line: mode, method
under the plugin, tuning switches), the order of the series, a row's inputs for
titles, and whether its requests arrived at a rate."""

from __future__ import annotations

from benchmarks.harness import modes
from benchmarks.harness.meta import tuning_switches


def series(row: dict) -> str:
    """A row's (or server's) line in tables and plots: its mode, the method
    under the plugin and any tuning switch its server ran with, so that a
    merged result keeps spec_extend on an EAGLE-3 head apart from spec_extend
    on a draft model, and an A/B's two servers apart."""
    name = row["mode"]
    if row.get("method") not in (None, "draft_model", row["mode"]):
        name = f"{name} on {row['method']}"
    switches = tuning_switches(row.get("plugin_env"))
    return f"{name} ({switches})" if switches else name


def series_key(row: dict) -> tuple[int, str]:
    """Lines in table order: plain, vLLM's methods, the plugin's modes."""
    return modes.LABELS.index(row["mode"]), series(row)


def inputs(row: dict) -> str:
    """A row's inputs, for titles: a mixed row has two lengths (rows from
    before the mixed workload have no ``short_input_len``)."""
    if row.get("short_input_len"):
        return f"{row['short_input_len']}- and {row['input_len']}-token inputs"
    return f"{row['input_len']}-token inputs"


def rated(row: dict) -> bool:
    """Whether a row's requests arrived at a rate (else in a burst)."""
    return row.get("request_rate") is not None
