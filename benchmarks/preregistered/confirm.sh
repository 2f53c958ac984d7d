#!/usr/bin/env bash
# The pre-registered confirmatory run (issue 31; sample_efficiency_mixed.json here): the learning-rate sweep, then
# one process per method and training seed, then --combine. Each process has its own store under $STORES and
# resumes where it stopped when started again (finished units from OUT.partial.json, a GRPO run from its last
# checkpoint); one whose result is already in $OUT is not run again. Each is refused (exit 2) if it is not the
# registered run (seeds, budget, rates, base, target).
#
#   bash benchmarks/preregistered/confirm.sh sweep     # 6 processes: {grpo_target, trace} x lr_grid, seed 100
#   bash benchmarks/preregistered/confirm.sh main      # 8 processes: {trace, grpo_target} x seeds 0..3
#   bash benchmarks/preregistered/confirm.sh combine   # benchmarks/results/sample_efficiency_mixed.json
#
# JOBS processes at a time (default 2, one per core, OMP_NUM_THREADS=1 each); results in $OUT, logs in $STORES;
# DRY=1 prints the commands instead; ONLY=trace (or grpo_target) runs one method's processes; REASON="..." says why
# the processes are started again (each logs its restart, with this reason, in its result's `restarts`).
set -euo pipefail
cd "$(dirname "$0")/../.."
REG=${REG:-benchmarks/preregistered/sample_efficiency_mixed.json}
OUT=${OUT:-benchmarks/results/confirm}
STORES=${STORES:-/tmp/trace-confirm}
JOBS=${JOBS:-2}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT" "$STORES"
reg() { "$PY" -c "import json,sys; print(json.load(open('$REG'))[sys.argv[1]])" "$1"; }
# the registration's `settings` as options (--adapter-validation 200000:200032 ...)
fixed=$("$PY" -c "import json; s = json.load(open('$REG')).get('settings') or {}
print(' '.join(f'--{k.replace(\"_\", \"-\")} {\",\".join(map(str, v)) if isinstance(v, list) else v}' for k, v in s.items()))")
common=(--preregistered "$REG" --target "$(reg target)" --base "$(reg base)" --budgets "$(reg budget)"
        --validation "$(reg validation)" $fixed)
one() {  # one process: NAME then its own options
  local name=$1; shift
  if [ -f "$OUT/$name.json" ]; then echo "$(date -u +%H:%M:%S) $name: done before ($OUT/$name.json)"; return; fi
  echo "$(date -u +%H:%M:%S) start $name"
  if [ -n "${DRY:-}" ]; then echo "$PY benchmarks/sample_efficiency.py ${common[*]} $*"; return; fi
  OMP_NUM_THREADS=1 "$PY" benchmarks/sample_efficiency.py "${common[@]}" "$@" ${REASON:+--restart-reason "$REASON"} --store "$STORES/$name" \
    --out "$OUT/$name.json" > "$STORES/$name.log" 2>&1 && echo "$(date -u +%H:%M:%S) done $name" \
    || { echo "$(date -u +%H:%M:%S) FAILED $name (see $STORES/$name.log)"; return 1; }
}
export -f one; export PY OUT STORES DRY REASON; export COMMON="${common[*]}"
run_all() {  # lines "NAME OPTIONS..." on stdin, JOBS at a time
  xargs -P "$JOBS" -L 1 bash -c 'common=($COMMON); one "$@"' _
}
case "${1:-}" in
  sweep)
    for lr in $("$PY" -c "import json; print(' '.join(map(str, json.load(open('$REG'))['lr_grid'])))"); do
      for m in ${ONLY:-trace grpo_target}; do
        echo "lr-$m-$lr --lr-sweep --train-seeds $(reg lr_sweep_seed) --methods $m --learning-rate $lr"
      done
    done | run_all ;;
  main)
    sweeps=$(ls "$OUT"/lr-*.json | grep -v '\.partial\.json$')
    for m in ${ONLY:-trace grpo_target}; do
      for s in $("$PY" -c "import json; print(' '.join(map(str, json.load(open('$REG'))['train_seeds'])))"); do
        echo "se-$m-$s --held-out $(reg held_out) --train-seeds $s --methods $m --learning-rate-from" $sweeps
      done
    done | run_all ;;
  combine)
    "$PY" benchmarks/sample_efficiency.py --combine $(ls "$OUT"/se-*.json | grep -v '\.partial\.json$') --out benchmarks/results/sample_efficiency_mixed.json ;;
  *) sed -n 2,13p "$0"; exit 2 ;;
esac
