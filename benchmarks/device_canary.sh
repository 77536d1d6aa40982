#!/usr/bin/env bash
# Train the canary on one GPU within a fixed time budget, then measure it (quality + speed).
# With its defaults this is v2's recipe (denoiser from scratch); the shipped v3 weights continue
# v2's with TRAIN_EXTRA="--init-from models/canary --seed 1 --img-grad 2 --ae-grad 1
# --img-grad-energy 3 --ae-grad-energy 2 --temporal-weight 2 --lr 3e-4 --ae-lr 5e-4" and
# AE_SECONDS=45 UNET_SECONDS=390 (the exact command: models/canary/README.md, "Training").
#
#   bash benchmarks/device_canary.sh OUT_DIR
#
# Run from the repository root (the repo need not be installed: PYTHONPATH=.). Needs, besides the
# tracked files:
#   .canary_data/photos.npz              training photographs (python tools/canary_train.py pack;
#                                        gradio/matplotlib ship some of them, so pack where they are)
#   .canary_data/lpips_alex.safetensors  LPIPS-alex weights (copy of ~/.cache/evalkit/lpips/v0.1/
#                                        alex.safetensors); found through $CANARY_LPIPS_WEIGHTS
#   .whl/*.whl                           optional: wheels of packages missing there (diffusers,
#                                        importlib_metadata, lpips; pydantic, pydantic_core,
#                                        annotated_types, typing_inspection for the suite and
#                                        backend code that bench_canary.py renders through),
#                                        installed into /tmp/site
# and the shipped models/canary (its autoencoder is reused: the encoder stays frozen, the decoder
# gains a source-conditioned branch and is tuned for AE_SECONDS).
#
# Writes into OUT_DIR (at most 8 files, none in subfolders, for the device tool's $OUT):
#   canary_model.tgz   the trained pipeline folder (extract with: tar -xzf canary_model.tgz -C models)
#   train.log, quality.json, quality.log, speed_bf16.json, summary.txt
# Timing (defaults, one H200 + 16 cores): ~15 s start, 40 s decoder tuning, 225 s denoiser,
# ~10 s validation/saving, then quality (~60 s) and speed (~10 s): about 6.5 minutes.
#
# Knobs (environment): CANARY_DEVICE (cuda), AE_SECONDS (40), UNET_SECONDS (225), WORKERS (13),
# BATCH (128), AE_BATCH (64), MIN_ITEMS (1500), BUFFER (12000), VAL_ITEMS (16), ITEM_BATCH (8),
# TRAIN_MARGIN (120: seconds allowed beyond the two budgets before training is stopped),
# MODEL_OUT (models/canary), QUALITY_ARGS ("--clips all"), EVAL_DTYPE (fp32), SPEED_DTYPE (bf16),
# PYTHON (python3), TRAIN_EXTRA (extra train.py arguments). CPU smoke test of this script:
#   CANARY_DEVICE=cpu AE_SECONDS=5 UNET_SECONDS=20 WORKERS=1 BATCH=2 AE_BATCH=4 MIN_ITEMS=16 \
#   BUFFER=64 VAL_ITEMS=1 ITEM_BATCH=2 TRAIN_MARGIN=900 MODEL_OUT=/tmp/canary_smoke \
#   QUALITY_ARGS="--max-views 1 --max-clips 1" PYTHON=.venv/bin/python \
#   bash benchmarks/device_canary.sh /tmp/canary_smoke_out
set -uo pipefail

OUT_DIR=${1:?usage: benchmarks/device_canary.sh OUT_DIR}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
DEV=${CANARY_DEVICE:-cuda}
MODEL_OUT=${MODEL_OUT:-models/canary}
AE_SECONDS=${AE_SECONDS:-40}
UNET_SECONDS=${UNET_SECONDS:-225}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DIFFUSERS_OFFLINE=1 PYTHONWARNINGS=ignore
export CANARY_LPIPS_WEIGHTS=${CANARY_LPIPS_WEIGHTS:-$PWD/.canary_data/lpips_alex.safetensors}
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "error: wheel install failed"; exit 1; }
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
for f in .canary_data/photos.npz "$CANARY_LPIPS_WEIGHTS" models/canary/vae/config.json; do
    [ -f "$f" ] || { echo "error: $f missing (see the header of $0)"; exit 2; }
done
$PY - <<'EOF' || exit 2
import importlib, sys
missing = [m for m in ("torch", "diffusers", "lpips", "safetensors", "cv2", "yaml", "skimage",
                       "sklearn", "PIL", "pydantic") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"error: python packages missing: {', '.join(missing)} (carry wheels in .whl/)")
import torch, diffusers
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, diffusers {diffusers.__version__}, "
      f"cuda {torch.cuda.is_available()} {torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}")
EOF

# the shipped autoencoder, kept aside before MODEL_OUT is written (they may be the same folder)
BASE=$(mktemp -d /tmp/canary_base.XXXX)
cp -r models/canary/vae "$BASE/vae"

say "training: decoder ${AE_SECONDS}s, denoiser ${UNET_SECONDS}s on $DEV"
timeout $(( ${AE_SECONDS%.*} + ${UNET_SECONDS%.*} + ${TRAIN_MARGIN:-120} )) \
  $PY tools/canary_train.py train --photos .canary_data/photos.npz --out "$MODEL_OUT" \
    --reuse-vae "$BASE" --lpips-weights "$CANARY_LPIPS_WEIGHTS" --device "$DEV" \
    --ae-seconds "$AE_SECONDS" --seconds "$UNET_SECONDS" --workers "${WORKERS:-13}" \
    --batch "${BATCH:-128}" --ae-batch "${AE_BATCH:-64}" --min-items "${MIN_ITEMS:-1500}" \
    --buffer "${BUFFER:-12000}" --val-items "${VAL_ITEMS:-16}" --item-batch "${ITEM_BATCH:-8}" \
    --seed 0 ${TRAIN_EXTRA:-} 2>&1 | tee "$OUT_DIR/train.log"
rc=$?
if [ $rc -ne 0 ] || [ ! -f "$MODEL_OUT/training.json" ]; then
    say "error: training failed (exit $rc); see train.log"; exit 1
fi
tar -czf "$OUT_DIR/canary_model.tgz" -C "$(dirname "$MODEL_OUT")" "$(basename "$MODEL_OUT")"
say "trained; pipeline folder packed into $OUT_DIR/canary_model.tgz"

say "quality (backend $DEV,dtype=${EVAL_DTYPE:-fp32}, ${QUALITY_ARGS:---clips all})"
timeout 200 $PY benchmarks/bench_canary.py quality --model "$MODEL_OUT" \
    --backend "$DEV,dtype=${EVAL_DTYPE:-fp32}" ${QUALITY_ARGS:---clips all} --out "$OUT_DIR/quality.json" \
    2>&1 | tee "$OUT_DIR/quality.log" | grep -v '^\[' 
say "speed (backend $DEV,dtype=${SPEED_DTYPE:-bf16}, 24x256x256 astronaut_pan, suite parameters)"
timeout 120 $PY benchmarks/bench_canary.py speed --model "$MODEL_OUT" \
    --backend "$DEV,dtype=${SPEED_DTYPE:-bf16}" --repeats 5 --out "$OUT_DIR/speed_bf16.json" >/dev/null 2>&1 \
    || say "speed run failed"

$PY - "$OUT_DIR" "$MODEL_OUT" <<'EOF' | tee "$OUT_DIR/summary.txt"
import json, sys
from pathlib import Path
out, model = Path(sys.argv[1]), Path(sys.argv[2])
tr = json.loads((model / "training.json").read_text())
idx = json.loads((model / "model_index.json").read_text())
print(f"\ntraining: {tr['device']}, decoder {tr['ae_steps']} steps, denoiser {tr['unet_steps']} steps, "
      f"{tr['items_generated']} items, {tr['seconds_total']} s; unet {tr['unet_config']}; "
      f"default guidance_steps {idx.get('guidance_steps')}")
q = out / "quality.json"
if q.is_file():
    rows = json.loads(q.read_text())["styles"]
    print(f"\n| style | LPIPS(out,tgt) | LPIPS(src,tgt) | ratio <=0.7 | grad >=0.7 | warp canary / classical | warp ratio <=2 | all met |")
    print("|---|---|---|---|---|---|---|---|")
    for s, r in rows.items():
        ok = lambda c: "" if c else " **fail**"
        w = r.get("warp_ratio")
        print(f"| {s} | {r['lpips_out']:.3f} | {r['lpips_src']:.3f} | {r['lpips_ratio']:.3f}{ok(r['lpips_ratio'] <= 0.7)} "
              f"| {r['grad_ratio']:.3f}{ok(r['grad_ratio'] >= 0.7)} | "
              f"{r.get('warp_canary', float('nan')):.4f} / {r.get('warp_classical', float('nan')):.4f} | "
              f"{(w if w is not None else float('nan')):.2f}{ok(w is None or w <= 2)} | {'yes' if r['pass'] else 'no'} |")
    print(f"\nall three met: {sum(r['pass'] for r in rows.values())}/{len(rows)} styles")
else:
    print("no quality.json (quality run failed or timed out: see quality.log)")
sp = out / "speed_bf16.json"
if sp.is_file():
    s = json.loads(sp.read_text())
    print(f"speed: {s['device_name']} {s['backend']}: median {s['median_s']} s ({s['seconds']}), target 0.5 s")
EOF
say "done"
