"""rich tables of a `homing top` frame: one row per model, one per version of the models that
have several (the versions table is left out when none has), one per worker; "-" for a figure
the gateway does not export (or, for rates and quantiles, before the window has two scrapes
or without requests in it). Below the models (and versions), one line per autoscaled model
from the admin API (`homing.top.scaler`), shown only when some model is autoscaled (or the
call failed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from homing.top.frame import Frame, ModelRow, VersionRow, WorkerRow
from homing.top.scaler import ScalerView

MODEL_COLUMNS = (
    "MODEL",
    "WORKERS",
    "REQ/S",
    "TOK/S",
    "IN-FLIGHT",
    "QUEUED",
    "TTFT p50",
    "TTFT p95",
    "TPOT p95",
    "GOODPUT/S",
    "ATTAIN",
    "SLO",
    "BURN 1h",
    "BURN 5m",
    "ALERTS",
)
VERSION_COLUMNS = (
    "MODEL",
    "VERSION",
    "WEIGHT",
    "REQ/S",
    "ERRORS",
    "ATTAIN",
    "TTFT p95",
    "TPOT p95",
    "ROLLOUT",
)
WORKER_COLUMNS = (
    "MODEL",
    "WORKER",
    "STATE",
    "PHASE",
    "REQ/S",
    "TTFT p95",
    "IN-FLIGHT",
    "RUNNING",
    "WAITING",
    "KV",
    "HIT",
)


def _or_dash(value: float | None, fmt: Callable[[float], str]) -> str:
    return "-" if value is None else fmt(value)


def seconds(value: float | None) -> str:
    """A latency in seconds as "1.25 s", "350 ms" (from 0.1 s) or "12.5 ms"; "-" for None."""

    def fmt(v: float) -> str:
        if v >= 1.0:
            return f"{v:.2f} s"
        return f"{v * 1000:.0f} ms" if v >= 0.1 else f"{v * 1000:.1f} ms"

    return _or_dash(value, fmt)


def rate(value: float | None) -> str:
    """A per-second rate with one decimal ("2.5"); "-" for None."""
    return _or_dash(value, lambda v: f"{v:.1f}")


def count(value: float | None) -> str:
    """A gauge of requests as an integer ("3"); "-" for None."""
    return _or_dash(value, lambda v: f"{v:.0f}")


def percent(value: float | None) -> str:
    """A 0..1 ratio as a percentage ("42.0%"); "-" for None."""
    return _or_dash(value, lambda v: f"{v * 100:.1f}%")


def burn(value: float | None) -> str:
    """A burn rate with two decimals ("0.40"); "-" for None."""
    return _or_dash(value, lambda v: f"{v:.2f}")


def _slo(row: ModelRow) -> str:
    if row.slo_ttft_s is None and row.slo_tpot_s is None:
        return "-"
    return f"ttft<={seconds(row.slo_ttft_s)} tpot<={seconds(row.slo_tpot_s)}"


def _workers(row: ModelRow) -> str:
    if row.workers is None:
        return "-"
    return " ".join(f"{n} {phase}" for phase, n in row.workers.items()) or "0"


def _alerts(row: ModelRow) -> Text:
    if row.alerts is None:
        return Text("-")
    if not row.alerts:
        return Text("none")
    return Text(",".join(row.alerts), style="bold red")


def model_cells(row: ModelRow) -> list[str | Text]:
    """The cells of `row` under `MODEL_COLUMNS`."""
    return [
        row.model,
        _workers(row),
        rate(row.requests_per_second),
        rate(row.output_tokens_per_second),
        count(row.in_flight),
        count(row.queued),
        seconds(row.ttft_p50_s),
        seconds(row.ttft_p95_s),
        seconds(row.tpot_p95_s),
        rate(row.goodput_requests_per_second),
        percent(row.attainment_ratio),
        _slo(row),
        burn(row.burn_rate_1h),
        burn(row.burn_rate_5m),
        _alerts(row),
    ]


def weight(value: float | None) -> str:
    """A split weight in percent, 0..100, as "90%" or "12.5%"; "-" for None."""
    return _or_dash(value, lambda v: f"{v:.1f}".removesuffix(".0") + "%")


def _rollout(row: VersionRow) -> str | Text:
    if row.rollout is None:
        return "-"
    text = f"canary {row.rollout}"
    if row.rollout == "rolled_back":
        return Text(text, style="bold red")
    if row.rollout in ("running", "paused"):
        return Text(text, style="bold yellow")
    return text


def version_cells(row: VersionRow) -> list[str | Text]:
    """The cells of `row` under `VERSION_COLUMNS` (the empty version label as "-")."""
    return [
        row.model,
        row.version or "-",
        weight(row.weight_percent),
        rate(row.requests_per_second),
        percent(row.error_ratio),
        percent(row.attainment_ratio),
        seconds(row.ttft_p95_s),
        seconds(row.tpot_p95_s),
        _rollout(row),
    ]


def worker_cells(row: WorkerRow) -> list[str | Text]:
    """The cells of `row` under `WORKER_COLUMNS`."""
    state: str | Text = row.state or "-"
    if row.state == "unhealthy":
        state = Text(row.state, style="bold red")
    return [
        row.model,
        row.worker,
        state,
        row.phase or "-",
        rate(row.requests_per_second),
        seconds(row.ttft_p95_s),
        count(row.in_flight),
        count(row.running),
        count(row.waiting),
        percent(row.kv_usage_ratio),
        percent(row.cache_hit_ratio),
    ]


def _table(title: str, headers: tuple[str, ...], rows: list[list[str | Text]]) -> Table:
    # Plain columns like `homing workers ls`: easy to read and to grep in a captured pane.
    table = Table(*headers, title=title, box=None, pad_edge=False, title_justify="left")
    for cells in rows:
        table.add_row(*(literal(c) if isinstance(c, str) else c for c in cells))
    return table


def literal(text: str) -> Text:
    """`text` shown as it is: no rich markup read from it, control characters escaped (a
    label value comes from the scraped server)."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return Text(text)


def scaler_line(pool: Mapping[str, Any]) -> str:
    """`scaler <model>: <mode> ready R/desired D warm W starting S draining X (<reason>)` of
    one `ScalerPool` (as `homing.admin.commands.scaler_dict` gives it): R, W, S and X now,
    D and the reason of the latest tick ("desired -" and "no decision yet" before it)."""
    last = pool.get("last")
    desired = "-" if last is None else str(last["desired_ready"])
    reason = "no decision yet" if last is None else last["reason"]
    return (
        f"scaler {pool['model']}: {pool['mode']} ready {pool['ready']}/desired {desired} "
        f"warm {pool['warm']} starting {pool['starting']} draining {pool['draining']} "
        f"({reason})"
    )


def _scaler_lines(scaler: ScalerView | None) -> list[RenderableType]:
    if scaler is None:
        return []
    lines: list[RenderableType] = [literal(scaler_line(p)) for p in scaler.pools]
    if scaler.error:
        lines.append(Text(f"scaler: {scaler.error}", style="bold red"))
    return [*lines, Text("")] if lines else []


def _versions(frame: Frame) -> list[RenderableType]:
    if not frame.versions:
        return []
    rows = [version_cells(v) for v in frame.versions]
    return [_table("versions", VERSION_COLUMNS, rows), Text("")]


def render(
    frame: Frame, source: str, status: str | None = None, scaler: ScalerView | None = None
) -> RenderableType:
    """The frame as a header line (`source`, the window, and `status` in red when given: a
    failed scrape), the models table, the versions table (only when some model has several
    versions), the scaler lines of `scaler` (none when no model is autoscaled; its error in
    red) and the workers table."""
    window = "-" if frame.window_s is None else f"{frame.window_s:.0f} s"
    header = Text(f"homing top  {source}  window {window} ({frame.scrapes} scrapes)", style="bold")
    if status:
        header.append(f"  {status}", style="bold red")
    return Group(
        header,
        Text(""),
        _table("models", MODEL_COLUMNS, [model_cells(m) for m in frame.models]),
        Text(""),
        *_versions(frame),
        *_scaler_lines(scaler),
        _table("workers", WORKER_COLUMNS, [worker_cells(w) for w in frame.workers]),
    )
