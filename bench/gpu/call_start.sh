# Sourced first by the one-call scripts (i21_round4*.sh, i17_recovery.sh): the repository root as the
# working directory, $O for the results ($OUT, else out/gpu), t0 and `left BUDGET_S` (seconds left of it).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[1]}")/../.."
O=${OUT:-$PWD/out/gpu}
mkdir -p "$O"
t0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - t0) )); }
# cuda_tests: tests/trainer/test_trainer_cuda_window.py on this machine's GPUs, into $O/pytest.txt. The
# repository's root conftest.py loads the control-plane plugin, which needs `kubernetes` (not on the GPU
# machine): hence --noconftest, and -o addopts= for the markers it would have registered.
cuda_tests() {
  (
    if [ -d .whl ]; then source bench/gpu/install_wheels.sh; fi
    export PYTHONPATH=$PWD/operator:$PWD/trainer_image${PYTHONPATH:+:$PYTHONPATH}
    timeout 120 python3 -m pytest -o addopts= --noconftest -p no:cacheprovider -q tests/trainer/test_trainer_cuda_window.py
  ) > "$O/pytest.txt" 2>&1
  echo "== cuda tests done at $(( $(date +%s) - t0 )) s"; tail -5 "$O/pytest.txt"
}
