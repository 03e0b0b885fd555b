"""Build homing's Grafana dashboard with grafana-foundation-sdk and write it as JSON.

    .venv/bin/python deploy/grafana/generate.py           # rewrite homing-dashboard.json
    .venv/bin/python deploy/grafana/generate.py --check   # exit 1 if the file is stale

Every query reads the gateway's raw `/metrics` series (names in `homing.obs`), never
recording rules, so the dashboard works against a bare Prometheus scraping homing. Queries
use the `$model` variable (`model=~"$model"`; "All" is `.*`) and `$__rate_interval` for
rates; the data source is the `${datasource}` variable (type prometheus). Worker-snapshot
gauges are aggregated with max/min by (model, worker) because every gateway instance
reports the same worker; per-gateway counts (requests in flight, queue depth) are summed.
Burn-rate thresholds 14.4 (page) and 6 (ticket) are the multiwindow alert rule's factors
(Google SRE workbook, "Alerting on SLOs"), as `homing_slo_alert` uses them. The "Versions and
rollouts" row splits the request series by their `version` label and reads the rollout series
of `homing.rollout.metrics` (the split's weights, the latest rollout's phase per canary,
verdicts and rollbacks); those have no data for a model without a split or a rollout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

#: Where the dashboard JSON lives (beside this script).
OUTPUT = Path(__file__).with_name("homing-dashboard.json")

#: Dashboard uid: stable, so a re-import replaces the dashboard instead of adding one.
UID = "homing-overview"

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
M = 'model=~"$model"'
RI = "$__rate_interval"


class _Ids:
    """Panel ids in dashboard order, 1, 2, ... (unique within the dashboard)."""

    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


def _query(expr: str, legend: str, ref: str, *, instant: bool = False) -> prometheus.Dataquery:
    """A Prometheus target on `${datasource}`: a range query, or an instant one in table
    format (for table panels)."""
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
    q = q.datasource(DATASOURCE)
    return q.instant().format(PromQueryFormat.TABLE) if instant else q.range()


def _targets(panel: Any, queries: list[tuple[str, str]]) -> Any:
    """`panel` with one range query per (expr, legend), refIds A, B, ..."""
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i)))
    return panel


def _steps(*steps: tuple[float | None, str]) -> dash_b.ThresholdsConfig:
    return (
        dash_b.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=v, color=c) for v, c in steps])
    )


def _series(
    ids: _Ids,
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    width: int = 8,
    thresholds: dash_b.ThresholdsConfig | None = None,
    dashed: str | None = None,
    stack: bool = False,
) -> timeseries.Panel:
    """A time series panel; `dashed`: a regex of series names drawn as dashed red reference
    lines (SLO rules); `thresholds`: drawn as dashed lines too."""
    panel = (
        timeseries.Panel()
        .id(ids.next())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .fill_opacity(10 if not stack else 40)
        .line_width(1)
        .show_points(common.VisibilityMode.NEVER)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if stack:
        panel = panel.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL))
    if thresholds is not None:
        panel = panel.thresholds(thresholds).thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
        )
    if dashed is not None:
        panel = panel.override_by_regexp(
            dashed,
            [
                DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
                DynamicConfigValue(id_val="custom.fillOpacity", value=0),
                DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "red"}),
            ],
        )
    return _targets(panel, queries)


def _stat(
    ids: _Ids,
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    thresholds: dash_b.ThresholdsConfig,
    mappings: list[ValueMap] | None = None,
    width: int = 6,
) -> stat.Panel:
    panel = (
        stat.Panel()
        .id(ids.next())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .thresholds(thresholds)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if mappings:
        panel = panel.mappings(list(mappings))
    return _targets(panel, queries)


def _rate(metric: str, by: str, selector: str = M) -> str:
    inner = f"{metric}{{{selector}}}" if selector else metric
    return f"sum by ({by}) (rate({inner}[{RI}]))"


def _quantiles(metric: str) -> list[tuple[str, str]]:
    buckets = f"sum by (model, le) (rate({metric}_bucket{{{M}}}[{RI}]))"
    return [
        (f"histogram_quantile({q}, {buckets})", f"p{round(q * 100)} {{{{model}}}}")
        for q in (0.5, 0.95, 0.99)
    ]


def _by_version(metric: str, q: float = 0.95) -> str:
    """The `q`-quantile of histogram `metric` per (model, version) over the rate interval."""
    buckets = f"sum by (model, version, le) (rate({metric}_bucket{{{M}}}[{RI}]))"
    return f"histogram_quantile({q}, {buckets})"


def build() -> dict[str, Any]:
    """The dashboard as a JSON-ready dict (Grafana 10/11 dashboard model)."""
    ids = _Ids()
    alert_map = ValueMap(
        {
            "0": ValueMappingResult(text="OK", color="green", index=0),
            "1": ValueMappingResult(text="FIRING", color="red", index=1),
        }
    )
    health_map = ValueMap(
        {
            "0": ValueMappingResult(text="unhealthy", color="red", index=0),
            "1": ValueMappingResult(text="healthy", color="green", index=1),
        }
    )
    builder = (
        dash_b.Dashboard("homing")
        .uid(UID)
        .description(
            "homing gateway: requests, TTFT/TPOT against the SLO, goodput, burn rate, "
            "workers, router, admission and quotas, versions and rollouts (raw /metrics "
            "series)."
        )
        .tags(["homing", "llm-inference"])
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            dash_b.QueryVariable("model")
            .label("Model")
            .datasource(DATASOURCE)
            .query("label_values(homing_requests_total, model)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )

    builder = builder.with_row(dash_b.Row("Requests").id(ids.next()))
    builder = builder.with_panel(
        _series(
            ids,
            "Request rate by outcome",
            "Requests per second as they end, by outcome (ok, client_closed, engine_error, "
            "timeout, rate_limited, no_capacity, ...).",
            "reqps",
            [(_rate("homing_requests_total", "outcome"), "{{outcome}}")],
            width=12,
            stack=True,
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "Tokens per second",
            "Prompt tokens in and completion tokens out, counted when a request ends.",
            "short",
            [
                (_rate("homing_prompt_tokens_total", "model"), "in {{model}}"),
                (_rate("homing_generation_tokens_total", "model"), "out {{model}}"),
            ],
            width=12,
        )
    )

    builder = builder.with_row(dash_b.Row("Latency against the SLO").id(ids.next()))
    builder = builder.with_panel(
        _series(
            ids,
            "TTFT p50 / p95 / p99",
            "Time to first token by model (streamed requests); the dashed line is the SLO's"
            " p95 TTFT target.",
            "s",
            [
                *_quantiles("homing_request_ttft_seconds"),
                (f"max by (model) (homing_slo_ttft_p95_seconds{{{M}}})", "SLO p95 {{model}}"),
            ],
            width=12,
            dashed="^SLO ",
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "TPOT p50 / p95 / p99",
            "Mean time per output token after the first (requests with >= 2 tokens); the "
            "dashed line is the SLO's p95 TPOT target.",
            "s",
            [
                *_quantiles("homing_request_tpot_seconds"),
                (f"max by (model) (homing_slo_tpot_p95_seconds{{{M}}})", "SLO p95 {{model}}"),
            ],
            width=12,
            dashed="^SLO ",
        )
    )

    builder = builder.with_row(dash_b.Row("Goodput and SLO attainment").id(ids.next()))
    builder = builder.with_panel(
        _series(
            ids,
            "Goodput (requests/s)",
            "Requests per second that met the SLO (TTFT and TPOT rules), over the last 60 s.",
            "reqps",
            [(f"sum by (model) (homing_goodput_requests_per_second{{{M}}})", "{{model}}")],
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "Goodput (tokens/s)",
            "Completion tokens per second of requests that met the SLO, over the last 60 s.",
            "short",
            [(f"sum by (model) (homing_goodput_tokens_per_second{{{M}}})", "{{model}}")],
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "SLO attainment (5 m)",
            "Met / (met + missed + failed) over the last 5 minutes; dashed: the objective.",
            "percentunit",
            [
                (f"min by (model) (homing_slo_attainment_ratio{{{M}}})", "{{model}}"),
                (f"max by (model) (homing_slo_objective{{{M}}})", "objective {{model}}"),
            ],
            dashed="^objective ",
        )
    )

    builder = builder.with_row(dash_b.Row("Error budget").id(ids.next()))
    builder = builder.with_panel(
        _series(
            ids,
            "Burn rate by window",
            "Error-budget burn rate: bad fraction over the window / (1 - objective). 1 spends "
            "the budget exactly; dashed lines at 6 (ticket) and 14.4 (page).",
            "short",
            [(f"max by (model, window) (homing_slo_burn_rate{{{M}}})", "{{model}} {{window}}")],
            width=16,
            thresholds=_steps((None, "green"), (6, "orange"), (14.4, "red")),
        )
    )
    builder = builder.with_panel(
        _stat(
            ids,
            "SLO alerts",
            "page: burn 1h > 14.4 and burn 5m > 14.4; ticket: burn 6h > 6 and burn 30m > 6.",
            "none",
            [(f"max by (model, severity) (homing_slo_alert{{{M}}})", "{{model}} {{severity}}")],
            thresholds=_steps((None, "green"), (1, "red")),
            mappings=[alert_map],
            width=8,
        )
    )

    builder = builder.with_row(dash_b.Row("Workers").id(ids.next()))
    builder = builder.with_panel(
        _series(
            ids,
            "Worker load",
            "Per worker: running and waiting requests (the engine's load records) and "
            "requests this gateway has dispatched to it.",
            "short",
            [
                (
                    f"max by (model, worker) (homing_worker_running_requests{{{M}}})",
                    "{{worker}} running",
                ),
                (
                    f"max by (model, worker) (homing_worker_waiting_requests{{{M}}})",
                    "{{worker}} waiting",
                ),
                (
                    f"sum by (model, worker) (homing_worker_requests_in_flight{{{M}}})",
                    "{{worker}} in flight",
                ),
            ],
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "KV cache usage",
            "Share of each worker's KV pool in use (0..1).",
            "percentunit",
            [(f"max by (model, worker) (homing_worker_kv_usage_ratio{{{M}}})", "{{worker}}")],
            thresholds=_steps((None, "green"), (0.95, "red")),
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "Prefix cache hit rate",
            "Cached / prompt tokens over each worker's recent requests.",
            "percentunit",
            [(f"max by (model, worker) (homing_worker_cache_hit_ratio{{{M}}})", "{{worker}}")],
        )
    )
    builder = builder.with_panel(
        table.Panel()
        .id(ids.next())
        .title("Worker health")
        .description("1: routable and healthy; 0: not (ejected, draining, failing probes).")
        .datasource(DATASOURCE)
        .span(12)
        .height(8)
        .mappings([health_map])
        .show_header(True)
        .with_target(
            _query(
                f"min by (model, worker) (homing_worker_healthy{{{M}}})",
                "{{worker}}",
                "A",
                instant=True,
            )
        )
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": {"Time": True}, "renameByName": {"Value": "healthy"}},
            )
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "Workers by phase",
            "Workers of each model per lifecycle phase (joining, ready, cordoned, draining, "
            "ejected).",
            "short",
            [(f"max by (model, phase) (homing_workers{{{M}}})", "{{model}} {{phase}}")],
            width=12,
            stack=True,
        )
    )

    builder = builder.with_row(dash_b.Row("Router, admission and quotas").id(ids.next()))
    builder = builder.with_panel(
        _series(
            ids,
            "Router decisions by branch",
            "Routing decisions per second: exact_hit/approx_hit (prefix affinity), ring "
            "(consistent hash of a cold prefix), veto/overflow/overload (load), ...",
            "ops",
            [(_rate("homing_router_decisions_total", "branch"), "{{branch}}")],
            stack=True,
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "Admission queue",
            "Requests waiting for capacity (left axis) and admission rejections per second "
            "(503: queue full, tenant share full, timeout) by reason.",
            "short",
            [
                (f"sum by (model) (homing_admission_queue_depth{{{M}}})", "queued {{model}}"),
                (
                    _rate("homing_admission_rejected_total", "reason", selector=""),
                    "rejected/s {{reason}}",
                ),
            ],
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "Quota rejections by tenant",
            "429s per second by tenant and by the quota hit (requests, tokens, streams).",
            "reqps",
            [
                (
                    _rate("homing_rate_limited_total", "tenant, quota", selector=""),
                    "{{tenant}} {{quota}}",
                )
            ],
            stack=True,
        )
    )
    builder = builder.with_row(dash_b.Row("Versions and rollouts").id(ids.next()))
    builder = builder.with_panel(
        _series(
            ids,
            "Request rate by version",
            "Requests per second as they end, by the version label of the worker that served "
            "them (empty: workers without a label, and refusals before routing).",
            "reqps",
            [(_rate("homing_requests_total", "model, version"), "{{model}} {{version}}")],
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "TTFT p95 by version",
            "Time to first token, p95 per version (streamed requests); dashed: the SLO's p95 "
            "TTFT target.",
            "s",
            [
                (_by_version("homing_request_ttft_seconds"), "{{model}} {{version}}"),
                (f"max by (model) (homing_slo_ttft_p95_seconds{{{M}}})", "SLO p95 {{model}}"),
            ],
            dashed="^SLO ",
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "TPOT p95 by version",
            "Mean time per output token after the first, p95 per version; dashed: the SLO's "
            "p95 TPOT target.",
            "s",
            [
                (_by_version("homing_request_tpot_seconds"), "{{model}} {{version}}"),
                (f"max by (model) (homing_slo_tpot_p95_seconds{{{M}}})", "SLO p95 {{model}}"),
            ],
            dashed="^SLO ",
        )
    )
    met = f'homing_slo_requests_total{{{M},verdict="met"}}'
    builder = builder.with_panel(
        _series(
            ids,
            "SLO attainment by version",
            "Met / judged (met + missed + failed) requests per version over the rate "
            "interval; dashed: the objective.",
            "percentunit",
            [
                (
                    f"sum by (model, version) (rate({met}[{RI}])) / "
                    + _rate("homing_slo_requests_total", "model, version"),
                    "{{model}} {{version}}",
                ),
                (f"max by (model) (homing_slo_objective{{{M}}})", "objective {{model}}"),
            ],
            width=12,
            dashed="^objective ",
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "Version weight",
            "Each version's share of new sessions under the model's split, percent (no "
            "series without a split); a rollout moves the canary's share step by step.",
            "percent",
            [(f"max by (model, version) (homing_version_weight{{{M}}})", "{{model}} {{version}}")],
            width=12,
            stack=True,
        )
    )
    builder = builder.with_panel(
        table.Panel()
        .id(ids.next())
        .title("Rollout phase")
        .description(
            "Each model's rollouts by canary: the phase it is in (running, paused, promoted, "
            "rolled_back) and the canary's weight now, percent."
        )
        .datasource(DATASOURCE)
        .span(12)
        .height(8)
        .show_header(True)
        .with_target(
            _query(
                f"max by (model, canary, phase) (homing_rollout_phase{{{M}}}) == 1",
                "{{canary}} {{phase}}",
                "A",
                instant=True,
            )
        )
        .with_target(
            _query(
                f"max by (model, canary) (homing_rollout_canary_weight{{{M}}})",
                "{{canary}}",
                "B",
                instant=True,
            )
        )
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value #A": True},
                    "renameByName": {"Value #B": "canary weight %"},
                },
            )
        )
    )
    builder = builder.with_panel(
        _series(
            ids,
            "Rollout verdicts and rollbacks",
            "Per minute: rollout verdicts by result (pass, fail, wait) and rollbacks by the "
            "check that failed first (operator: by hand).",
            "short",
            [
                (
                    "60 * " + _rate("homing_rollout_verdicts_total", "model, result"),
                    "verdict {{model}} {{result}}",
                ),
                (
                    "60 * " + _rate("homing_rollout_rollbacks_total", "model, check"),
                    "rollback {{model}} {{check}}",
                ),
            ],
            width=12,
        )
    )
    data: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    # The SDK writes `"annotations": {}` when none is added; Grafana expects a list there
    # and adds its built-in "Annotations & Alerts" query to it on load.
    data["annotations"].setdefault("list", [])
    return data


def render() -> str:
    """The dashboard JSON text as committed: 2-space indent, sorted keys, final newline."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write `OUTPUT`; with `--check`, exit 1 (writing nothing) when it differs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale: run python deploy/grafana/generate.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
