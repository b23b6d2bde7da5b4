#!/usr/bin/env bash
# The triton_moe backend's GPU run, in one call: GPU tests, the per-stage times and config sweep of
# benchmarks/triton_moe_stages.py, then `hal bench moe` on the public layers it serves. Run from
# the repository root on the GPU host; logs and tables go under $OUT.
#     bash backends/triton_moe/device_run.sh [test s] [stages s] [bench s] [token counts]
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/triton-moe-run}"
TEST_S="${1:-300}"
STAGES_S="${2:-150}"
BENCH_S="${3:-240}"
TOKENS="${4:-1,8,64,512,4096}"
mkdir -p "$OUT"

# Installed, not only on the path: the registry finds backends through the package's entry points.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/machine.txt" 2>&1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import hal; print([c.name for c in hal.select_moe_kernel(hal.MoESpec(8, 2, 256, 128), device='cuda').decision.candidates])"
} 2>&1 | tee -a "$OUT/machine.txt"

timeout "$TEST_S" python3 -m pytest -q -p no:cacheprovider -m cuda tests/triton_moe 2>&1 | tee "$OUT/tests.txt"
tests=$?

timeout "$STAGES_S" bash -c "python3 benchmarks/triton_moe_stages.py
    python3 benchmarks/triton_moe_stages.py --sweep --points gpt-oss-120b:mxfp4:1,gpt-oss-120b:mxfp4:64" \
    2>&1 | tee "$OUT/stages.md"

bench() {
    python3 -m hal.cli.main bench moe --device cuda --backend triton_moe --iters 5 --markdown "$@" \
        2>>"$OUT/bench_progress.txt" | tee -a "$OUT/bench.md"
}
timeout "$BENCH_S" bash -c "$(declare -f bench); OUT=$OUT
    bench --model qwen3-30b-a3b --tokens $TOKENS --no-reference
    bench --model deepseek-v3 --local-experts 32 --tokens $TOKENS --no-reference
    bench --model mixtral-8x7b --format bf16 --tokens $TOKENS --no-reference
    bench --model gpt-oss-120b --tokens $TOKENS --no-reference
    bench --model qwen3-30b-a3b --format fp8_block128 --tokens $TOKENS --no-reference"
bench=$?
echo "tests=$tests bench=$bench" | tee "$OUT/status.txt"
