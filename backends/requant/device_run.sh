#!/usr/bin/env bash
# The requant backend's GPU run, in one call: GPU tests, compute-sanitizer on one case, benchmark.
# Run from the repository root on the GPU host; logs and results go under $OUT.
#     bash backends/requant/device_run.sh [bench arguments]
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/requant-run}"
mkdir -p "$OUT"

# Installed, not only on the path: the registry finds backends through the package's entry points.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/pip.txt" 2>&1 || tail -5 "$OUT/pip.txt"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/machine.txt"

python3 -m pytest -q -p no:cacheprovider -m cuda tests/requant 2>&1 | tee "$OUT/tests.txt"
tests=$?

python3 -m hal.cli.main bench requant --iters 7 --markdown --out "$OUT/bench.json" "$@" \
    2>"$OUT/bench_progress.txt" | tee "$OUT/bench.md"
bench=$?
# Decode points with DeepEP's fixed buffer (1024 rows per expert): the second phase is compiled in
# and its bookkeeping paid even when no expert passes the cap.
python3 -m hal.cli.main bench requant --hidden 7168 --experts 8,256,512 --rows 1,8 --skew 1,16 \
    --min-max-m 1024 --iters 7 --markdown --out "$OUT/bench_deepep.json" \
    2>>"$OUT/bench_progress.txt" | tee "$OUT/bench_deepep.md"
bench=$((bench + $?))

timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m backends.requant.memcheck_case 2>&1 | tail -20 | tee "$OUT/memcheck.txt"
memcheck=$?

echo "tests=$tests bench=$bench memcheck=$memcheck" | tee "$OUT/status.txt"
