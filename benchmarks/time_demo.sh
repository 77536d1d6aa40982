#!/usr/bin/env bash
# `make demo` as a new user meets it: a fresh clone, `make demo`, timed until the server answers.
#
#   bash benchmarks/time_demo.sh [REPO] [WORKDIR]     # REPO defaults to this checkout
#
# Clones REPO into WORKDIR/clone (default /tmp/evalkit-demo-time), runs `make demo` there with
# DEMO_OUT=WORKDIR/out and DEMO_PORT=$PORT (7917), polls the port every 2 s, and when it answers
# prints the seconds since the clone and the load average, then stops the server. The log is
# WORKDIR/demo.log; step end times can be read from the files' modification times (the venv's
# .demo-stamp, each run folder, the report's summary.json, the study database).
set -u
REPO=${1:-$(cd "$(dirname "$0")/.." && pwd)}
WORK=${2:-/tmp/evalkit-demo-time}
PORT=${PORT:-7917}
LOG=$WORK/demo.log
rm -rf "$WORK/clone" "$WORK/out"; mkdir -p "$WORK"
echo "start $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" > "$LOG"
T0=$(date +%s)
git clone -q "$REPO" "$WORK/clone" || exit 2
cd "$WORK/clone" || exit 2
setsid make demo DEMO_PORT="$PORT" DEMO_OUT="$WORK/out" >> "$LOG" 2>&1 &
PID=$!
while kill -0 "$PID" 2>/dev/null; do
  if curl -s -o /dev/null -m 2 "http://127.0.0.1:$PORT/"; then
    echo "SERVED after $(( $(date +%s) - T0 )) s at $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$LOG"
    kill -- -"$PID"; exit 0
  fi
  sleep 2
done
echo "make demo ended without serving after $(( $(date +%s) - T0 )) s (see $LOG)" | tee -a "$LOG"; exit 1
