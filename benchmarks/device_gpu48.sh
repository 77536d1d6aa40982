#!/bin/bash
# Issue 48 items 1-2 on one GPU machine (session 23). Carried as .gpu48/ in the lead's checkout:
# base.tgz (main at 407c832: evalkit, metrics, app, the benchmark scripts, datasets' make_scale),
# new.tgz (this branch, the same paths), av.tar.xz (PyAV 18.1, its shared objects stripped),
# whl/ (pydantic), lpips/v0.1 (the alex weights), this script. Made here with, e.g.
#   P="evalkit metrics app pyproject.toml benchmarks/bench_wait.py benchmarks/profile_compare.py
#      benchmarks/profile_import.py datasets/make_scale.py datasets/make_clips.py datasets/scale720"
#   git archive --format=tar.gz -o .gpu48/new.tgz HEAD $P   (base.tgz: the baseline commit)
#   av.tar.xz: the PyAV wheel unpacked, its .so files `strip --strip-unneeded` (36 -> 20 MB: the
#   call's 64 MiB holds the checkout's 33 MB too). Run from the checkout's root:
#   bash .gpu48/device_gpu48.sh probe   # set-up, farms, the baseline's steps and profiles
#   bash .gpu48/device_gpu48.sh full    # farms, before/after alternated (bench_wait --baseline)
set -e
MODE=${1:-probe}
G=$PWD/.gpu48
mkdir -p /tmp/site /tmp/base /tmp/new
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $G/whl/*.whl
tar xJf $G/av.tar.xz -C /tmp/site
tar xzf $G/base.tgz -C /tmp/base
[ -f $G/new.tgz ] && tar xzf $G/new.tgz -C /tmp/new
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 EVALKIT_CACHE_DIR=$G GRADIO_ANALYTICS_ENABLED=False
echo "cores $(nproc)"; nvidia-smi -L
python3 -c "
import importlib
for m in ('av','torch','pydantic','yaml','tqdm','PIL','scipy','safetensors','cv2','pandas','matplotlib','jinja2','lpips','skimage'):
    try: print(m, getattr(importlib.import_module(m), '__version__', '?'), end='; ')
    except Exception as e: print(m, 'MISSING', end='; ')
print()"
W=/tmp/bw
T=${TREE:-/tmp/base}
t0=$(date +%s.%N)
PYTHONPATH=$T:$PYTHONPATH python3 $T/benchmarks/bench_wait.py --out $OUT --work $W --device cuda --stage farms
echo "farms made in $(python3 -c "print(round($(date +%s.%N)-$t0,1))") s"
if [ "$MODE" = probe ]; then
  PYTHONPATH=/tmp/new:$PYTHONPATH python3 /tmp/new/benchmarks/profile_import.py $W/farm_b 2>&1 | tee $OUT/profile_import.txt
  PYTHONPATH=$T:$PYTHONPATH python3 $T/benchmarks/bench_wait.py --out $OUT --work $W --device cuda --stage steps 2>&1 | tee $OUT/wait_base.txt
  R=$W/runs-ours
  for i in 1 2; do
    (cd /tmp/base && PYTHONPATH=/tmp/base:$PYTHONPATH TRITON_CACHE_DIR=$W/cache-ours/triton TORCHINDUCTOR_CACHE_DIR=$W/cache-ours/inductor \
      python3 /tmp/new/benchmarks/profile_compare.py $R/farmA $R/farmB --out /tmp/prof$i --device cuda --quiet) > $OUT/prof_base_$i.txt 2>&1 || tail -5 $OUT/prof_base_$i.txt
  done
  grep -h "ends\|exit" $OUT/prof_base_2.txt | grep -v "warm-up.*0.00 s" | tail -30
else
  PYTHONPATH=/tmp/new:$PYTHONPATH python3 /tmp/new/benchmarks/bench_wait.py --out $OUT --work $W --device cuda --stage steps --baseline /tmp/base 2>&1 | tee $OUT/wait_full.txt
  R=$W/runs-ours
  for t in new base; do
    (cd /tmp/$t && PYTHONPATH=/tmp/$t:$PYTHONPATH TRITON_CACHE_DIR=$W/cache-ours/triton TORCHINDUCTOR_CACHE_DIR=$W/cache-ours/inductor \
      python3 /tmp/new/benchmarks/profile_compare.py $R/farmA $R/farmB --out /tmp/prof_$t --device cuda --quiet) > $OUT/prof_$t.txt 2>&1 || tail -5 $OUT/prof_$t.txt
    grep -h "exit\|measure.*ends\|write_report ends\|warm-up.*ends" $OUT/prof_$t.txt | grep -v "warm-up.*0.00 s" | tail -14
  done
fi
