#!/usr/bin/env bash
# Behaviour unchanged across a refactor: render the canary suite on two backends (cpu fp32 and
# cpu bf16, `-r canary`) and compare them against the canary gate's absolute thresholds (its verdict is in
# summary.json and compare.txt; exit code 1, a failed gate, is a verdict too), once with the code of
# commit BEFORE and once with the working tree, then diff the CSV rows and summary figures
# (timestamps, paths and the version string aside). Usage, from the repository root:
#   bash benchmarks/equivalence.sh BEFORE_COMMIT [OUT]      (about 6 minutes on 2 cores)
set -euo pipefail
BEFORE=${1:?commit before the refactor}
OUT=${2:-/tmp/evalkit-equivalence}
PY=${PY:-$PWD/.venv/bin/python}
rm -rf "$OUT"; mkdir -p "$OUT"
git worktree add --detach "$OUT/before-src" "$BEFORE" >/dev/null
trap 'git worktree remove --force "$OUT/before-src" >/dev/null 2>&1 || true' EXIT
run() {  # $1: label, $2: source tree
  local dir="$OUT/$1"
  mkdir -p "$dir"
  ( cd "$dir" && export PYTHONPATH="$2" GRADIO_ANALYTICS_ENABLED=False &&
    "$PY" -m evalkit render "$2/datasets/canary/suite.yaml" -b cpu -b cpu,dtype=bf16 \
        -r canary --out runs --quiet >/dev/null &&
    { "$PY" -m evalkit compare runs/cpu runs/cpu_dtype-bf16 --out report --device cpu \
        --gate "$OUT/gate.yaml" --quiet > compare.txt || test $? -eq 1; } )
}
# the canary gate's absolute thresholds (its floor ratio needs a seed floor run)
printf 'lpips: {mean: {max: 0.05}, worst: {max: 0.2}}\nssim: {mean: {min: 0.9}}\n' > "$OUT/gate.yaml"
run before "$OUT/before-src"
run after "$PWD"
"$PY" - "$OUT" <<'PY'
import csv, json, sys, hashlib
from pathlib import Path
out = Path(sys.argv[1])
def rows(p):
    return list(csv.reader(open(p)))
def strip(d):
    if isinstance(d, dict):
        return {k: strip(v) for k, v in d.items()
                if k not in ("created", "evalkit_version", "path", "files", "updated", "timing")}
    if isinstance(d, list):
        return [strip(v) for v in d]
    return d
ok = True
for name in ("frames.csv", "clips.csv"):
    a, b = rows(out / "before/report" / name), rows(out / "after/report" / name)
    same = a == b
    ok &= same
    print(f"{name}: {len(a) - 1} rows before, {len(b) - 1} after: {'identical' if same else 'DIFFERENT'}")
sa = json.loads((out / "before/report/summary.json").read_text())
sb = json.loads((out / "after/report/summary.json").read_text())
same = strip(sa.get("aggregates")) == strip(sb.get("aggregates")) and sa.get("gate") == sb.get("gate")
ok &= same
print(f"summary.json aggregates and gate: {'identical' if same else 'DIFFERENT'}")
print(f"gate verdict: before {(sa.get('gate') or {}).get('verdict')}, after {(sb.get('gate') or {}).get('verdict')}")
for run in ("cpu", "cpu_dtype-bf16"):
    for clip in sorted((out / "before/runs" / run / "clips").glob("*.mkv")):
        other = out / "after/runs" / run / "clips" / clip.name
        h = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
        if h(clip) != h(other):
            ok = False
            print(f"clip {run}/{clip.name}: DIFFERENT")
print(f"lossless clips: {'bit-identical' if ok else 'see above'}")
for f in ("compare.txt",):
    a = (out / "before" / f).read_text().replace(str(out / "before"), "X")
    b = (out / "after" / f).read_text().replace(str(out / "after"), "X")
    print(f"{f}: {'identical' if a == b else 'differs'}")
    if a != b:
        import difflib
        print("".join(list(difflib.unified_diff(a.splitlines(True), b.splitlines(True)))[:40]))
print("EQUIVALENT" if ok else "NOT EQUIVALENT")
PY
