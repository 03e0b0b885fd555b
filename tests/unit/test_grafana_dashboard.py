"""deploy/grafana/homing-dashboard.json is what deploy/grafana/generate.py builds, and its
shape is what Grafana 10/11 and the panels' queries need: a prometheus `${datasource}`
variable, a `model` variable from `label_values(homing_requests_total, model)`, and every
target with an expr, a legend and a refId unique in its panel, filtered by `$model` where
the series has a model label, with `$__rate_interval` in every rate."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "deploy" / "grafana" / "generate.py"
DASHBOARD = ROOT / "deploy" / "grafana" / "homing-dashboard.json"
#: Series without a `model` label (homing.gateway.metrics): their panels cannot take $model.
NO_MODEL_LABEL = {"homing_admission_rejected_total", "homing_rate_limited_total"}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("homing_grafana_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found += [panel, *panel.get("panels", [])]
    return found


def test_committed_json_is_what_the_generator_builds() -> None:
    """Regenerate with `.venv/bin/python deploy/grafana/generate.py` when this fails."""
    assert DASHBOARD.read_text() == _generator().render()


def test_check_mode_fails_on_a_stale_file(tmp_path: Path) -> None:
    generator = _generator()
    generator.OUTPUT = tmp_path / "homing-dashboard.json"
    generator.OUTPUT.write_text("{}\n")
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0
    assert generator.OUTPUT.read_text() == DASHBOARD.read_text()


def test_variables_are_a_prometheus_datasource_and_the_served_models() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert (model["type"], model["query"]) == (
        "query",
        "label_values(homing_requests_total, model)",
    )
    assert model["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert (model["multi"], model["includeAll"], model["allValue"]) == (True, True, ".*")


def test_every_panel_has_unique_ids_and_targets_on_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "stat", "table"}, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        targets = panel["targets"]
        assert targets, panel["title"]
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in targets:
            assert target["expr"] and target["legendFormat"], (panel["title"], target)


def test_queries_filter_by_model_and_rate_over_the_rate_interval() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    for expr in exprs:
        metrics = set(re.findall(r"\b(homing_\w+)\b", expr))
        assert metrics, expr
        if not metrics & NO_MODEL_LABEL:
            assert 'model=~"$model"' in expr, expr
        for window in re.findall(r"\brate\([^\[]*\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", expr
        assert not re.search(r"\bhoming:", expr), f"a recording rule in {expr}"


def _exported_names() -> set[str]:
    """Sample names a gateway's registry declares for the versions row: the request series
    (`RequestMetrics`), the per-model SLO gauges (`RequestRecorder`, one model watched) and
    the rollout series (`RolloutMetrics`)."""
    from prometheus_client import CollectorRegistry

    from homing.obs.requests import RequestMetrics, RequestRecorder
    from homing.rollout.metrics import RolloutMetrics

    registry = CollectorRegistry()
    recorder = RequestRecorder(now=lambda: 0.0, metrics=RequestMetrics(registry), registry=registry)
    recorder.watch("m", lambda: [])
    RolloutMetrics(registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_versions_row_reads_series_the_gateway_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    (row,) = [p for p in dashboard["panels"] if p["title"] == "Versions and rollouts"]
    at = dashboard["panels"].index(row)
    after = dashboard["panels"][at + 1 :]
    ends = next((i for i, p in enumerate(after) if p["type"] == "row"), len(after))
    panels = [*row.get("panels", []), *after[:ends]]
    assert {p["title"] for p in panels} >= {
        "Request rate by version",
        "TTFT p95 by version",
        "TPOT p95 by version",
        "SLO attainment by version",
        "Version weight",
        "Rollout phase",
        "Rollout verdicts and rollbacks",
    }
    exported = _exported_names()
    for panel in panels:
        for target in panel["targets"]:
            used = set(re.findall(r"\b(homing_\w+)\b", target["expr"]))
            assert used <= exported, (panel["title"], used - exported)
