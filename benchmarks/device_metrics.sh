#!/usr/bin/env bash
# The metrics engine benchmarks on a GPU machine, in about four minutes at most.
#
#   bash benchmarks/device_metrics.sh OUT_DIR
#
# Runs from the repository root (or anywhere: it changes there), with PYTHONPATH=. -- the
# package need not be installed. Three parts, each its own process with its own time limit:
#   fidelity  LPIPS+SSIM+PSNR+exactness, ours against the naive loop       (limit 55 s)
#   full      the full set incl. temporal, ours against naive, then the
#             flow pool capacity per DIS preset                            (limit 75 s)
#   memory    2,000 pairs streamed through ours: peak RSS and GPU memory   (limit 80 s)
# Results: OUT_DIR/PART.txt (what it printed), PART.json (the numbers), PART.log (stdout and
# stderr), summary.txt (printed at the end).
#
# Overrides (to try the script on a CPU machine, e.g. METRICS_DEVICE=cpu METRICS_SIZE=128x96
# METRICS_SECONDS=1 METRICS_FRAMES=16 METRICS_MEMORY_FRAMES=64):
#   METRICS_DEVICE (cuda), METRICS_SIZE (1280x720), METRICS_SECONDS (6: minimum timed run of
#   ours), METRICS_FRAMES (1000: minimum pairs timed for ours), METRICS_MEMORY_FRAMES (2000),
#   METRICS_PYTHON (python3), METRICS_EXTRA (more bench_metrics.py options, e.g. --flow-preset
#   ultrafast), METRICS_LIMIT_SCALE (1: multiplies the time limits).
set -u

OUT="${1:?usage: device_metrics.sh OUT_DIR}"
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"

PY="${METRICS_PYTHON:-python3}"
DEVICE="${METRICS_DEVICE:-cuda}"
SIZE="${METRICS_SIZE:-1280x720}"
SECONDS_MIN="${METRICS_SECONDS:-6}"
FRAMES="${METRICS_FRAMES:-1000}"
MEMORY_FRAMES="${METRICS_MEMORY_FRAMES:-2000}"
EXTRA="${METRICS_EXTRA:-}"
SCALE="${METRICS_LIMIT_SCALE:-1}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning}"

limit() { "$PY" -c "import sys; print(int(float(sys.argv[1]) * float(sys.argv[2])))" "$1" "$SCALE"; }

{
  echo "host: $(hostname) | cpus: $(nproc) | $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import torch, cv2, numpy, skimage; print('python', __import__('sys').version.split()[0], '| torch', torch.__version__, '| cuda', torch.cuda.is_available(), '| opencv', cv2.__version__, '| numpy', numpy.__version__, '| scikit-image', skimage.__version__)"
  "$PY" -c "import lpips; print('lpips', getattr(lpips, '__version__', '?'))" 2>&1 | tail -1
} | tee "$OUT/environment.txt"

run_part() {  # name, limit in seconds, options...
  local name="$1" lim
  lim="$(limit "$2")"
  shift 2
  local t0=$SECONDS
  # shellcheck disable=SC2086
  timeout --kill-after=10 "$lim" "$PY" benchmarks/bench_metrics.py --device "$DEVICE" --size "$SIZE" \
      --part "$name" --out "$OUT" "$@" $EXTRA >"$OUT/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then
    echo "[$name] ok in ${took} s"
    grep -E "^(ours|naive|ratio|memory|peak|  agreement|  flow pool|  LPIPS alone)" "$OUT/$name.log" | sed 's/^/    /'
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "[$name] TIMED OUT after ${lim} s; last lines:"
    tail -n 8 "$OUT/$name.log" | sed 's/^/    /'
  else
    echo "[$name] FAILED (exit $rc) after ${took} s; last lines:"
    tail -n 15 "$OUT/$name.log" | sed 's/^/    /'
  fi
}

run_part fidelity 55 --frames "$FRAMES" --seconds "$SECONDS_MIN"
run_part full 75 --frames "$FRAMES" --seconds "$SECONDS_MIN"
run_part memory 80 --memory "$MEMORY_FRAMES"

echo
"$PY" benchmarks/bench_metrics.py --summarize "$OUT"
