"""The plain-Prometheus scrape config example: valid for promtool, and consistent with the chart's pod
labels and with what the rules expect (job name, honor_labels).

Debian's promtool is built without Kubernetes service discovery, so when it refuses
`kubernetes_sd_configs` as an unknown field, the config is checked with that block replaced by an
equivalent static target; everything else (relabelling, rule files, honor_labels) is still promtool's
verdict. A promtool with Kubernetes SD (PROMTOOL=/path) checks the file as it is.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests import tier_gate
from tests.controlplane import assets
from trainop.api import trainingjob
from trainop.controller import rayjob

from .conftest import MONITORING, REPO_ROOT, RULES_FILE, run_promtool

CONFIG = MONITORING / "scrape-configs" / "prometheus.yml"


def _config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return config


def _jobs() -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in _config()["scrape_configs"]}


def test_scrape_config_passes_promtool_check_config(promtool: Path, tmp_path: Path) -> None:
    shutil.copytree(MONITORING, tmp_path / "monitoring")
    target = tmp_path / "monitoring" / "scrape-configs" / "prometheus.yml"
    result = run_promtool(promtool, "check", "config", target.name, cwd=target.parent)
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        config = copy.deepcopy(_config())
        for job in config["scrape_configs"]:
            assert job.pop("kubernetes_sd_configs")
            job["static_configs"] = [{"targets": ["127.0.0.1:9100"]}]
        target.write_text(yaml.safe_dump(config))
        result = run_promtool(promtool, "check", "config", target.name, cwd=target.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr


def test_both_jobs_honor_labels_and_the_operator_job_is_the_one_the_alert_watches() -> None:
    jobs = _jobs()
    assert set(jobs) == {"trainop-operator", "trainop-trainers"}
    assert all(job["honor_labels"] is True for job in jobs.values())
    assert 'up{job="trainop-operator"}' in RULES_FILE.read_text()
    for name, regex in [("trainop-operator", "metrics"), ("trainop-trainers", "metrics(-[0-9]+)?")]:
        assert {
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": regex,
            "action": "keep",
        } in (jobs[name]["relabel_configs"])


def test_the_trainers_job_keeps_the_metrics_port_of_every_local_rank_and_nothing_else() -> None:
    (keep,) = [
        r
        for r in _jobs()["trainop-trainers"]["relabel_configs"]
        if r.get("source_labels") == ["__meta_kubernetes_pod_container_port_name"]
    ]
    max_gpus = trainingjob.Workers.model_json_schema(by_alias=True)["properties"]["gpusPerWorker"]["maximum"]
    for rank in range(max_gpus):  # Prometheus anchors relabel regexes at both ends
        assert re.fullmatch(keep["regex"], rayjob.metrics_port_name(rank)), rank
    assert not re.fullmatch(keep["regex"], "ray-metrics")


def test_pod_selectors_match_the_chart_operator_pod_and_the_trainer_pod_label() -> None:
    helm = assets.resolve().helm
    if helm is None and assets.find_go() is not None:
        assets.build_missing(["helm"])
        helm = assets.resolve().helm
    if helm is None:
        tier_gate.missing_tool("helm", assets.HOW_TO_ENABLE)
    chart = REPO_ROOT / "charts" / "trainop"
    rendered = subprocess.run(
        [str(helm), "template", "trainop", str(chart), "--show-only", "templates/deployment.yaml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    labels = yaml.safe_load(rendered)["spec"]["template"]["metadata"]["labels"]
    operator_selector = _jobs()["trainop-operator"]["kubernetes_sd_configs"][0]["selectors"][0]["label"]
    for requirement in operator_selector.split(","):
        key, value = requirement.split("=")
        assert labels.get(key) == value, f"the operator pod has no label {requirement}"
    trainer_selector = _jobs()["trainop-trainers"]["kubernetes_sd_configs"][0]["selectors"][0]["label"]
    helpers = (REPO_ROOT / "charts" / "trainop" / "templates" / "_helpers.tpl").read_text()
    assert trainer_selector == "app.kubernetes.io/managed-by=trainop"
    assert "app.kubernetes.io/managed-by: trainop" in helpers  # the PodMonitor/NetworkPolicy selector
