#!/usr/bin/env bash
# Issue #21: what sets a compiled ResNet-50 run's level? Round 6 (docs/benchmarks-gpu.md) saw the same trainer
# configuration at 100.0 % and 84.7 % of one bare run in one call; round 7 (2026-11-28 01:41 UTC) alternated
# bare and trainer and found the trainer steadily at 86 % with 91 % GPU utilisation against bare's 97 %.
# Bare compiled DDP and the trainer runs of RUNS (default: bare, trainer, bare, trainer, ... while the budget
# lasts) on one machine with one compile cache, each with a longer timed period (--steps, default 200),
# while nvidia-smi samples every GPU's SM clock, power, temperature, utilisation and active clock-event
# (throttle) reasons every 0.5 s into clocks.csv; each run's start and end go to runs.txt. One device call:
#   run(command="bash bench/gpu/i21_alternate.sh", kind="nvidia-h100-x4", carry=[".whl"], timeout_s=570)
#   run(command="RUNS='bare trainer:gc=synced trainer bare trainer:gc=synced trainer' bash bench/gpu/i21_alternate.sh", ...)
# A RUNS entry is `bare`, `trainer` or `trainer:SWITCHES` (TRAINOP_SWITCHES for that run, e.g. gc=synced), or
# `launch`: the same Trainer under torchrun (`trainop_trainer.launch`, no Ray), beside the trainer through Ray.
# `trainer@VAR=VALUE+VAR=VALUE...`: the trainer through Ray with these variables in the driver's environment;
# `bare@VAR=VALUE+...`: bare DDP with them (e.g. `bare@TORCHINDUCTOR_CPP_WRAPPER=1`).
# The bench's local Ray (its raylet, dashboard agent and workers) is started by the driver and inherits them, so
# this switches Ray's own periodic work per run, e.g. REPORTER_UPDATE_INTERVAL_MS (the dashboard agent's node
# and GPU stats, every 5 s), RAY_memory_monitor_refresh_ms, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, OMP_NUM_THREADS.
# `launch:SWITCHES` and `launch@VAR=VALUE+...`: the same for the Trainer under torchrun (its processes inherit
# the variables), e.g. `launch@OMP_NUM_THREADS=1` or `launch:control_every=8`.
# A `ladder:RUNG+RUNG...` entry runs bench/gpu/ladder.py on GPUS GPUs (compiled unless WORKLOAD is eager): the
# trainer's parts added to bare DDP one at a time, in one process group, without Ray; LADDER_STEPS timed steps
# per rung (default STEPS).
# AB_VARIANTS (e.g. 'normalise=copy,normalise=step'), AB_STEPS (20), AB_ROUNDS (2): every eager ResNet-50
# trainer run then runs these switch variants in alternating blocks after its timed steps, in the same
# processes (bench_hooks' A/B blocks; rank 0 logs each block's ms/step).
# SPY=1: while each bare, launch or trainer run trains (GPU 0 busy for 3 s, then SPY_DELAY_S more, default 0),
# every training process's threads are sampled: `top -H` (CPU per thread), its allowed CPUs, and py-spy
# (carried in .whl/: build it with PY_SPY=1 bash bench/gpu/prepare_wheels.sh) for SPY_S seconds (default 5), every thread and then only the GIL's holder, non-blocking;
# into the run's directory.
# GPUS=2 on a 2-GPU machine; WORKLOAD=resnet50 for the eager pair; BUDGET_S (default 540).
# CUDA_TESTS=1: first tests/trainer/test_trainer_cuda_window.py on this machine's GPUs (call_start.sh's
# cuda_tests; pytest.txt). A second run of this script in one call needs its own OUT=$OUT/NAME: each ends by
# packing everything it wrote into one file, $O/runs.tar.gz (a device call brings back at most 8 files).
# TIMELINE=1: every launch and trainer run writes the Trainer's step timeline of its timed steps on every rank
# (TRAINOP_TIMELINE_STEPS=20:STEPS into the run's timeline/ directory: per step the host's time and its parts,
# garbage collection, the training thread's CPU time and context switches, the device's time and the host's
# lead over it), and at the end bench/gpu/timeline_summary.py says, per run, which rank's host was behind in
# each sag and what grew (timeline-<run>.md).
# TRACE=1: every bare and trainer run also profiles 10 steps after its timed ones (torch.profiler; the trainer's
# TRAINOP_TRACE_STEPS window), and at the end trace_summary.py compares the first bare run's rank-0 trace with
# each trainer run's (trace-<run>.md: the step period split into training-stream time, exposed NCCL, other
# streams and idle; the idle gaps and what the loop's thread did in the longest).
source "$(dirname "$0")/call_start.sh"
GPUS=${GPUS:-4}
WORKLOAD=${WORKLOAD:-resnet50-compile}
STEPS=${STEPS:-200}
BUDGET=${BUDGET_S:-540}
FIELDS=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
if nvidia-smi --query-gpu=clocks_throttle_reasons.active --format=csv,noheader > /dev/null 2>&1; then
  FIELDS=$FIELDS,clocks_throttle_reasons.active
fi
nvidia-smi --query-gpu=$FIELDS --format=csv -lms 500 > "$O/clocks.csv" 2> "$O/clocks.err" &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null' EXIT
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$O/nvidia-smi-q.txt" 2>&1
if [ -d .whl ] && [ ! -d /tmp/site ]; then source bench/gpu/install_wheels.sh || exit 1; fi
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD/operator:$PWD/trainer_image${PYTHONPATH:+:$PYTHONPATH}
if [ "${CUDA_TESTS:-0}" = 1 ]; then cuda_tests; fi  # before the runs: a failure shows even if a run overruns
spy() {  # DIR PATTERN: sample the threads of the processes matching PATTERN once GPU 0 has been busy 3 s
  local dir=$1 pattern=$2 busy=0 tries=0
  mkdir -p "$dir"
  while (( tries < 600 )); do
    tries=$((tries + 1)); sleep 0.5
    u=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i 0 2>/dev/null | tr -d ' ')
    if [ "${u:-0}" -ge 80 ] 2>/dev/null; then busy=$((busy + 1)); else busy=0; fi
    (( busy >= 6 )) && break
  done
  local pids=() pid
  for pid in $(pgrep -f "$pattern"); do  # the training processes, not their launchers
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qE 'torch.distributed.run|suite.py|run_all.sh' || pids+=("$pid")
  done
  pids=("${pids[@]:0:4}")
  sleep "${SPY_DELAY_S:-0}"
  echo "spy at $(date +%FT%T.%3N) after $tries samples: pids ${pids[*]}" > "$dir/spy.txt"
  for pid in "${pids[@]}"; do
    { echo "== $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-200)"; grep -E 'Cpus_allowed_list|Threads' /proc/$pid/status
      taskset -pc "$pid" 2>&1; } >> "$dir/spy.txt"
    (top -H -b -d 2 -n 2 -p "$pid" > "$dir/top-$pid.txt" 2>&1 &)
    (py-spy record --pid "$pid" --duration "${SPY_S:-5}" --rate 100 --nonblocking --threads --idle --format raw \
      --output "$dir/spy-all-$pid.txt" > "$dir/spy-all-$pid.log" 2>&1 &)
    (py-spy record --pid "$pid" --duration "${SPY_S:-5}" --rate 100 --nonblocking --threads --gil --format raw \
      --output "$dir/spy-gil-$pid.txt" > "$dir/spy-gil-$pid.log" 2>&1 &)
  done
  sleep $(( ${SPY_S:-5} + 2 ))
  for pid in "${pids[@]}"; do py-spy dump --pid "$pid" > "$dir/dump-$pid.txt" 2>&1; done
}
ladder() {  # NAME RUNGS(+-joined)
  local name=$1 rungs=${2//+/,} compile=--compile
  [[ $WORKLOAD == *compile* ]] || compile=
  if (( $(left "$BUDGET") < 120 )); then echo "== $name skipped: $(left "$BUDGET") s left"; return 1; fi
  echo "$name start $(date +%FT%T.%3N)" >> "$O/runs.txt"
  (source bench/gpu/env.sh && timeout $(( $(left "$BUDGET") - 5 )) python3 -m torch.distributed.run --standalone --nproc-per-node="$GPUS" \
    bench/gpu/ladder.py $compile --rungs "$rungs" --warmup 20 --steps "${LADDER_STEPS:-$STEPS}") > "$O/$name.txt" 2>&1
  echo "$name end $(date +%FT%T.%3N)" >> "$O/runs.txt"
  echo "== $name done at $(( $(date +%s) - t0 )) s:"
  grep '^LADDER ' "$O/$name.txt" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line[7:])
    print(f\"  {r['rung']:<12} {r['step_ms']:8.2f} ms/step {r['samples_per_second']:10.1f} samples/s \"
          f\"warm-up {r['warmup_s']:6.1f} s  {r.get('added_to', '')} {r.get('added_ms', 0):+.2f} ms\")
    for rank, h in enumerate(r.get('host_by_rank') or []):
        w, l = h.get('data_wait_ms', {}), h.get('lead_ms', {})
        print(f\"    rank {rank}: next() p50 {w.get('p50')} p99 {w.get('p99')} max {w.get('max')} ms; \"
              f\"lead p10 {l.get('p10')} p50 {l.get('p50')} min {l.get('min')} ms, \"
              f\"{h.get('steps_lead_under_1ms')} steps under 1 ms\")"
}
one() {  # NAME PHASE [SWITCHES [VAR=VALUE+VAR=VALUE...]]
  local name=$1 phase=$2 switches=${3:-} envs=()
  if [ -n "${4:-}" ]; then
    IFS=+ read -r -a envs <<< "$4"
    echo "$name env: ${envs[*]}" >> "$O/env.txt"
  fi
  if (( $(left "$BUDGET") < 75 )); then echo "== $name skipped: $(left "$BUDGET") s left"; return 1; fi
  echo "$name start $(date +%FT%T.%3N)" >> "$O/runs.txt"
  local spier=
  if [ "${SPY:-0}" = 1 ]; then
    case $phase in bare*) spy "$O/$name-spy" 'bare_ddp.py' & ;; launch*) spy "$O/$name-spy" 'trainop_trainer.launch' & ;; *) spy "$O/$name-spy" '^ray::RayTrainWorker' & ;; esac
    spier=$!
  fi
  if [ "${TIMELINE:-0}" = 1 ] && [[ $phase != bare* ]]; then
    envs+=("TRAINOP_TIMELINE_STEPS=20:$STEPS" "TRAINOP_TIMELINE_DIR=$O/$name/timeline")
  fi
  local trace=(--diagnose-gpus 0)
  [ -n "${AB_VARIANTS:-}" ] && trace=(--diagnose-gpus "$GPUS" --trace-steps 0)
  [ "${TRACE:-0}" = 1 ] && trace=(--diagnose-gpus "$GPUS" --trace-workload "$WORKLOAD" --trace-steps 10)
  env "${envs[@]}" TRAINOP_SWITCHES=$switches OUT=$O/$name DEADLINE_S=$(( $(left "$BUDGET") - 5 )) bash bench/gpu/run_all.sh \
    --gpus "$GPUS" --workloads "$WORKLOAD" --only "$phase" "${trace[@]}" --recovery-gpus 0 --ab-variants "${AB_VARIANTS:-}" \
    --ab-steps "${AB_STEPS:-20}" --ab-rounds "${AB_ROUNDS:-2}" --steps "$STEPS" > "$O/$name.txt" 2>&1
  echo "$name end $(date +%FT%T.%3N)" >> "$O/runs.txt"
  [ -n "$spier" ] && kill "$spier" 2>/dev/null
  echo "== $name ($switches${4:+; $4}) done at $(( $(date +%s) - t0 )) s: $(grep -E '^RESULT ' "$O/$name.txt" \
    | grep -oE '"impl": "[a-z]+"|"samples_per_second": [0-9.]+|"window_rates": \[[^]]*\]' | paste -sd' ')"
  grep -h '"variant"' "$O/$name/results.jsonl" 2>/dev/null \
    | grep -oE '"variant": "[^"]*"|"from_step": [0-9]+|"ms_per_step": [0-9.]+' | paste -d' ' - - - | sed 's/^/   ab /'
  return 0
}
n=0
for run in ${RUNS:-bare trainer bare trainer bare trainer}; do
  n=$((n + 1))
  case $run in
    bare) one "$n-bare" "bare$GPUS" || break ;;
    bare@*) one "$n-bare-env" "bare$GPUS" "" "${run#bare@}" || break ;;
    trainer) one "$n-trainer" "ray$GPUS-$WORKLOAD" || break ;;
    launch) one "$n-launch" "launch$GPUS-$WORKLOAD" || break ;;
    launch@*) one "$n-launch-env" "launch$GPUS-$WORKLOAD" "" "${run#launch@}" || break ;;
    launch:*) one "$n-launch-$(echo "${run#launch:}" | tr '=,' '-_')" "launch$GPUS-$WORKLOAD" "${run#launch:}" || break ;;
    ladder:*) ladder "$n-ladder" "${run#ladder:}" || break ;;
    trainer@*) one "$n-trainer-env" "ray$GPUS-$WORKLOAD" "" "${run#trainer@}" || break ;;
    trainer:*) one "$n-trainer-$(echo "${run#trainer:}" | tr '=,' '-_')" "ray$GPUS-$WORKLOAD" "${run#trainer:}" || break ;;
    *) echo "== unknown run $run" ;;
  esac
done
kill $SAMPLER 2>/dev/null
if [ "${TRACE:-0}" = 1 ]; then  # rank 0's traces (traces.tar.gz of each run): the first bare run against each trainer run
  for d in "$O"/[0-9]*-*/; do [ -f "$d/traces.tar.gz" ] && tar -xzf "$d/traces.tar.gz" -C "$d"; done
  bare_dir=$(ls -d "$O"/[0-9]*-bare*/traces/bare* 2>/dev/null | head -1)  # bare or bare@VAR=... (N-bare-env)
  for t in $(ls -d "$O"/[0-9]*-trainer*/traces/ray* 2>/dev/null); do
    run=$(basename "$(dirname "$(dirname "$t")")")
    if [ -n "$bare_dir" ]; then
      python3 bench/gpu/trace_summary.py --run "bare DDP=$bare_dir" --run "$run=$t" \
        --json "$O/$run/trace.json" --text "$O/trace-$run.md" > /dev/null 2>&1 || echo "== trace summary of $run failed"
      echo "== trace: bare against $run"; cat "$O/trace-$run.md" 2>/dev/null | head -60
    fi
  done
fi
for d in "$O"/[0-9]*-*/timeline; do  # TIMELINE=1: what grew in each run's slow steps
  [ -d "$d" ] || continue
  run=$(basename "$(dirname "$d")")
  python3 bench/gpu/timeline_summary.py "$d" --json "$O/timeline-$run.json" > "$O/timeline-$run.md" 2>&1 \
    || echo "== timeline summary of $run failed"
  echo "== timeline: $run"; head -40 "$O/timeline-$run.md"
done
echo "== total $(( $(date +%s) - t0 )) s"
# Mean SM clock and power per GPU while each run was timed is for the reader (docs/benchmarks-gpu.md); here
# only a line per run: the mean SM clock over all GPUs between the run's start and end.
python3 - "$O" <<'EOF'
import csv, datetime, sys
out = sys.argv[1]
rows = list(csv.reader(open(f"{out}/clocks.csv")))[1:]
def ts(text):
    return datetime.datetime.strptime(text.strip()[:23], "%Y/%m/%d %H:%M:%S.%f").timestamp()
marks = {}
for line in open(f"{out}/runs.txt"):
    name, what, when = line.split()
    marks.setdefault(name, {})[what] = datetime.datetime.fromisoformat(when).timestamp()
for name, m in marks.items():
    if "end" not in m:
        continue
    sel = [r for r in rows if len(r) > 4 and m["start"] <= ts(r[0]) + 0.0 <= m["end"]]
    # Training samples only: utilisation >= 50 % and power >= 300 W (before the warm-up a GPU can show
    # 100 % utilisation at ~130 W).
    busy = [r for r in sel if r[6].strip().rstrip(" %").isdigit() and int(r[6].strip().rstrip(" %")) >= 50
            and r[4].strip().split()[0].replace(".", "").isdigit() and float(r[4].split()[0]) >= 300]
    def mean(rs, i):
        vals = [float(r[i].split()[0]) for r in rs if r[i].strip().split()[0].replace(".", "").isdigit()]
        return round(sum(vals) / len(vals), 1) if vals else None
    print(f"clocks {name}: {len(busy)} busy samples, SM {mean(busy, 2)} MHz, mem {mean(busy, 3)} MHz, "
          f"power {mean(busy, 4)} W, temp {mean(busy, 5)} C; reasons {sorted({r[7].strip() for r in busy if len(r) > 7})}")
EOF
# At most 8 files come back from a device call, however many scripts ran in it: everything this run wrote
# goes into one archive, $O/runs.tar.gz (the per-run outputs and directories, clocks.csv, runs.txt, env.txt,
# nvidia-smi-q.txt, pytest.txt; what the console printed above is its summary).
(cd "$O" && tar -czf ../.runs-$$.tar.gz --remove-files ./* 2>/dev/null; mv ../.runs-$$.tar.gz runs.tar.gz; true)
