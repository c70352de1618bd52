# Sourced first by the one-call scripts (i21_round4*.sh, i17_recovery.sh): the repository root as the
# working directory, $O for the results ($OUT, else out/gpu), t0 and `left BUDGET_S` (seconds left of it).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[1]}")/../.."
O=${OUT:-$PWD/out/gpu}
mkdir -p "$O"
t0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - t0) )); }
