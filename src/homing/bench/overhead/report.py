"""The figures of `make bench-overhead` over its rounds: medians per metric and target, the
ratios (homing/smg, after/before, metrics on/off, the fixed stream intervals against homing
and smg at 1), and
the table printed on stdout.

Rule of this file: pure arithmetic over the rounds' JSON-ready dicts and their rendering;
no clock, no processes, no files.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from homing.bench.overhead.targets import (
    DIRECT,
    GRPC_FLOOR,
    HOMING,
    HOMING_BEFORE,
    HOMING_GRPC,
    HOMING_NOMETRICS,
    HOMING_P2,
    P2_PROCESSES,
    SMG,
    STREAM_INTERVALS,
    TARGETS,
)


def _median(rounds: Sequence[dict[str, Any]], *path: str) -> float | None:
    values = []
    for r in rounds:
        node: Any = r
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, int | float):
            values.append(float(node))
    return round(statistics.median(values), 4) if values else None


METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("gateway CPU per non-streamed request (ms, 16 tokens)", "cpu_ms_non_streamed",
     ("non_streamed", "{t}", "gateway_cpu_ms")),
    ("gateway CPU per streamed token (us, slope 64 -> 256)", "cpu_us_per_streamed_token",
     ("cpu_us_per_streamed_token", "{t}")),
    ("gateway CPU per streamed request, 64 tokens (ms)", "cpu_ms_streamed_64",
     ("streamed_64", "{t}", "gateway_cpu_ms")),
    ("gateway CPU per streamed request, 256 tokens (ms)", "cpu_ms_streamed_256",
     ("streamed_256", "{t}", "gateway_cpu_ms")),
    ("requests/s at concurrency 32 (non-streamed)", "rps_c32", ("rps", "{t}", "rps")),
    ("gateway CPU per request at concurrency 32 (ms)", "cpu_ms_c32",
     ("rps", "{t}", "gateway_cpu_ms")),
    ("added first byte p50, non-streamed (ms)", "added_p50_ms_non_streamed",
     ("first_byte_non_streamed", "{t}", "added_p50_ms")),
    ("added first byte p99, non-streamed (ms)", "added_p99_ms_non_streamed",
     ("first_byte_non_streamed", "{t}", "added_p99_ms")),
    ("added first byte p50, streamed (ms)", "added_p50_ms_streamed",
     ("first_byte_streamed", "{t}", "added_p50_ms")),
    ("added first byte p99, streamed (ms)", "added_p99_ms_streamed",
     ("first_byte_streamed", "{t}", "added_p99_ms")),
    ("workers' CPU per non-streamed request (ms)", "workers_cpu_ms_non_streamed",
     ("non_streamed", "{t}", "workers_cpu_ms")),
    ("CPU per streamed message (us, slope 64 -> 256)", "cpu_us_per_streamed_message",
     ("cpu_us_per_streamed_message", "{t}")),
)  # fmt: skip
"""(table label, JSON key, path into a round with "{t}" for the target)."""

FLOOR_METRICS = frozenset({
    "cpu_ms_non_streamed", "cpu_us_per_streamed_token", "cpu_ms_streamed_64",
    "cpu_ms_streamed_256", "workers_cpu_ms_non_streamed", "cpu_us_per_streamed_message",
    "peak_rss_mib",
})  # fmt: skip
"""The metrics the grpc.aio floor has (its "gateway" CPU is the bare client's)."""
INTERVAL_METRICS = (
    ("cpu_us_per_streamed_token", "CPU per streamed token (us, slope)"),
    ("cpu_ms_streamed_256", "CPU per streamed request, 256 tok (ms)"),
    ("added_p50_ms_streamed", "added first byte p50, streamed (ms)"),
)
"""(JSON key, table label) of the rows each fixed stream interval gets beside homing's and
smg's at stream_interval 1."""


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 3) if top is not None and bottom else None


def summarize(rounds: Sequence[dict[str, Any]], rss: dict[str, float]) -> dict[str, Any]:
    """Medians over the rounds per metric and target, the ratios (homing/smg, after/before =
    homing/homing_before, metrics on/off = homing/homing_nometrics, each fixed interval's
    target against homing and against smg (both at 1), 2 processes / 1 = homing_p2/homing),
    the direct gRPC baseline."""
    medians: dict[str, dict[str, float | None]] = {}
    for _, key, path in METRICS:
        medians[key] = {t: _median(rounds, *(p.format(t=t) for p in path)) for t in TARGETS}
    medians["peak_rss_mib"] = {t: rss.get(t) for t in TARGETS}
    ratios, after_before, metrics, processes = {}, {}, {}, {}
    for key, values in medians.items():
        ratios[key] = _ratio(values.get(HOMING), values.get(SMG))
        after_before[key] = _ratio(values.get(HOMING), values.get(HOMING_BEFORE))
        metrics[key] = _ratio(values.get(HOMING), values.get(HOMING_NOMETRICS))
        processes[key] = _ratio(values.get(HOMING_P2), values.get(HOMING))
    intervals: dict[str, dict[str, dict[str, float | None]]] = {}
    for target in STREAM_INTERVALS:
        intervals[target] = {
            key: {
                "to_homing": _ratio(medians[key].get(target), medians[key].get(HOMING)),
                "to_smg": _ratio(medians[key].get(target), medians[key].get(SMG)),
            }
            for key, _ in INTERVAL_METRICS
        }
    baseline = {
        f"direct_{kind}_{q}_ms": _median(rounds, f"first_byte_{kind}", DIRECT, f"{q}_ms")
        for kind in ("non_streamed", "streamed")
        for q in ("p50", "p99")
    }
    return {
        "medians": medians,
        "ratios": ratios,
        "ratios_after_before": after_before,
        "ratios_metrics_on_off": metrics,
        "ratios_intervals_to_si1": intervals,
        "ratios_p2_to_p1": processes,
        "direct_grpc_baseline": baseline,
    }


def print_table(result: dict[str, Any]) -> None:
    """The medians as a rich table on stdout; then the fixed stream intervals' figures in a
    table of their own, each beside homing's and smg's at stream_interval 1."""
    from rich.console import Console
    from rich.table import Table

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"

    settings = result["settings"]
    targets = set(settings["targets"])
    table = Table(
        title=f"gateway overhead, median of {settings['rounds']} rounds "
        f"(2 instant workers, round robin; {result['machine']['cpu_model']}, "
        f"{result['machine']['cores']} cores)",
        title_justify="left",
    )
    before = HOMING_BEFORE in targets
    nometrics = HOMING_NOMETRICS in targets
    p2 = HOMING_P2 in targets
    homing = HOMING in targets
    before_name = f"homing before ({settings['homing_before_commit'] or 'old src'})"
    columns = [
        ("metric", True), ("homing", homing), ("smg", SMG in targets),
        ("homing/smg", homing and SMG in targets),
        (before_name, before), ("after/before", before),
        ("homing, no request metrics", nometrics), ("metrics on/off", nometrics and homing),
        (f"homing, {P2_PROCESSES} processes", p2), (f"{P2_PROCESSES} proc/1", p2 and homing),
        ("homing gRPC API", HOMING_GRPC in targets),
        ("grpc.aio client alone", GRPC_FLOOR in targets),
    ]  # fmt: skip
    shown = [present for _, present in columns]
    for name, present in columns:
        if present:
            metric = name == "metric"
            table.add_column(name, justify="left" if metric else "right", no_wrap=metric)

    def add(cells: list[str]) -> None:
        table.add_row(*(c for c, present in zip(cells, shown, strict=True) if present))

    medians, ratios, after_before, on_off, by_processes = (
        result["medians"], result["ratios"], result["ratios_after_before"],
        result["ratios_metrics_on_off"], result["ratios_p2_to_p1"],
    )  # fmt: skip
    labels = [(label, key) for label, key, _ in METRICS] + [("peak RSS (MiB)", "peak_rss_mib")]
    for label, key in labels:
        row = medians[key]
        if key == "cpu_us_per_streamed_message" and row.get(GRPC_FLOOR) is None:
            continue
        grpc_cell = cell(row.get(HOMING_GRPC)) if not key.startswith(("rps", "cpu_ms_c32")) else ""
        if key == "peak_rss_mib":
            grpc_cell = "(same process)"
        if key == "cpu_us_per_streamed_message":
            grpc_cell = ""
        floor_cell = cell(row.get(GRPC_FLOOR)) if key in FLOOR_METRICS else ""
        gateway = key != "cpu_us_per_streamed_message"
        add([
            label,
            cell(row.get(HOMING)) if gateway else "", cell(row.get(SMG)) if gateway else "",
            cell(ratios[key]) if gateway else "",
            cell(row.get(HOMING_BEFORE)) if gateway else "",
            cell(after_before[key]) if gateway else "",
            cell(row.get(HOMING_NOMETRICS)) if gateway else "",
            cell(on_off[key]) if gateway else "",
            cell(row.get(HOMING_P2)) if gateway else "",
            cell(by_processes[key]) if gateway else "", grpc_cell, floor_cell,
        ])  # fmt: skip
    console = Console()
    if not console.is_terminal:  # a log or a pipe: wide enough for one line a row
        console = Console(width=200)
    console.print(table)
    shown_intervals = [(t, k) for t, k in STREAM_INTERVALS.items() if t in targets]
    if shown_intervals:
        console.print(_intervals_table(result, shown_intervals, cell))
    base = result["direct_grpc_baseline"]
    console.print(
        f"direct gRPC first byte (the baseline): non-streamed p50 "
        f"{cell(base['direct_non_streamed_p50_ms'])} ms, p99 "
        f"{cell(base['direct_non_streamed_p99_ms'])} ms; streamed p50 "
        f"{cell(base['direct_streamed_p50_ms'])} ms, p99 {cell(base['direct_streamed_p99_ms'])} ms"
    )
    if GRPC_FLOOR in targets:
        console.print(
            "grpc.aio client alone: one process, one grpc.aio channel to a worker, the same "
            "engine calls and no gateway; its own CPU (all threads) per call and per message"
        )
    counts = result["errors"]["counts"]
    console.print(
        "errors: " + (", ".join(f"{t} {n}" for t, n in counts.items()) if counts else "none")
        + f"; wall time {result['wall_s']:g} s; rps by {settings['rps_generator']}"
    )  # fmt: skip


def _intervals_table(
    result: dict[str, Any], shown: list[tuple[str, int]], cell: Callable[[float | None], str]
) -> Any:
    """A rich table: one row per stream interval (1 = the homing target), per metric of
    INTERVAL_METRICS its median and its ratios to homing's and smg's at 1."""
    from rich.table import Table

    medians = result["medians"]
    table = Table(
        title="homing at fixed stream intervals (ratios: to homing and to smg at interval 1)",
        title_justify="left",
    )
    table.add_column("stream_interval", justify="right")
    for _, label in INTERVAL_METRICS:
        table.add_column(label, justify="right")
        table.add_column("/ homing", justify="right")
        table.add_column("/ smg", justify="right")
    rows = [(HOMING, 1, None), *((t, k, result["ratios_intervals_to_si1"][t]) for t, k in shown)]
    for target, interval, ratios in rows:
        cells = [str(interval)]
        for key, _ in INTERVAL_METRICS:
            cells.append(cell(medians[key].get(target)))
            if ratios is None:  # homing's own row: 1 where it was measured
                own = medians[key].get(HOMING) is not None
                cells += ["1" if own else "-", cell(result["ratios"][key])]
            else:
                cells += [cell(ratios[key]["to_homing"]), cell(ratios[key]["to_smg"])]
        table.add_row(*cells)
    return table
