#!/bin/bash
# Carried as .devwriter/ (this checkout's evalkit, metrics, app, benchmarks/bench_render_scale.py, datasets/make_scale.py,
# make_clips.py, scale720/suite.yaml as ours/; PyAV 18.1 as av.tar.xz; pydantic wheels in whl/), run from it on the device.
# evalkit render at real scale on the device: main (the checkout's root) against ours (.devwriter/ours)
set -e
ROOT=$(cd .. && pwd)
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl
tar xJf av.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
echo "cores $(nproc)"; nvidia-smi -L
python3 -c "import av, torch, pydantic; print('av', av.__version__, 'torch', torch.__version__, 'pydantic', pydantic.VERSION)"
t0=$(date +%s)
python3 ours/datasets/make_scale.py 2>&1 | tail -1
echo "suite generated in $(( $(date +%s) - t0 )) s"
python3 ours/benchmarks/bench_render_scale.py ours/datasets/scale720/suite.yaml \
  --backend cuda,dtype=bf16 --steps "${STEPS:-100}" --repeats "${REPEATS:-3}" --budget "${BUDGET:-200}" \
  main="$ROOT" main-auto="$ROOT:EVALKIT_RENDER_WRITES=auto" main-procs="$ROOT:EVALKIT_WRITER_PROCESSES=1" \
  ours="$PWD/ours" 2>&1 | tee "$OUT/render_scale_h200.txt"
