#!/usr/bin/env bash
# Copy the generated/source artefacts the chart ships into it: Helm cannot read files outside the chart.
#
#   crds/*.yaml                                  -> charts/trainop/crds/            (make crds writes the source)
#   monitoring/prometheus/trainop.rules.yaml     -> charts/trainop/files/prometheus/
#   monitoring/grafana/*.json                    -> charts/trainop/files/dashboards/
#
# tests/chart/test_chart_files.py fails when a copy differs from its source, naming this script.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/trainop"

sync_dir() {  # source-glob-dir pattern dest
  local src="$1" pattern="$2" dest="$3"
  mkdir -p "$dest"
  # Remove copies whose source is gone, then copy every source file.
  local f
  for f in "$dest"/$pattern; do
    [[ -e "$f" ]] || continue
    [[ -e "$src/$(basename "$f")" ]] || { rm -f "$f"; echo "removed $f"; }
  done
  for f in "$src"/$pattern; do
    [[ -e "$f" ]] || continue
    cmp -s "$f" "$dest/$(basename "$f")" || { cp "$f" "$dest/"; echo "updated $dest/$(basename "$f")"; }
  done
}

sync_dir "$ROOT/crds" "*.yaml" "$CHART/crds"
sync_dir "$ROOT/monitoring/prometheus" "trainop.rules.yaml" "$CHART/files/prometheus"
sync_dir "$ROOT/monitoring/grafana" "*.json" "$CHART/files/dashboards"
