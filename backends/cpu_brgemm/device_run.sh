#!/usr/bin/env bash
# cpu_brgemm on the device host (Intel Emerald Rapids, AMX): install, build both ISA
# specializations, run the cpu_brgemm tests (amx included), then `hal bench` for the three issue-3
# layers. Everything lands in $OUT: log.txt, tests.txt, probe.json and one bench JSON per model.
#
#   bash backends/cpu_brgemm/device_run.sh            # tests + full benchmark
#   BENCH=quick bash backends/cpu_brgemm/device_run.sh  # tests + a short benchmark
#   MODELS=qwen3_fp8 TOKENS=1 THREADS=2 ...             # any subset, e.g. a local dry run
#   SKIP_TESTS=1 ...                                    # benchmark only
set -o pipefail
export PYTHONUNBUFFERED=1
export HAL_CACHE_DIR=${HAL_CACHE_DIR:-/tmp/moe-hal-cache}
OUT=${OUT:-/tmp/cpu_brgemm_out}
mkdir -p "$OUT"
THREADS=${THREADS:-16}
TOKENS=${TOKENS:-1,4,16,64,256,1024}
ROUTING=${ROUTING:-uniform,concentrated}
ITERS=${ITERS:-20}

{
  echo "== host"; date -u; nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(|L3'
  python -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads())'
  python -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | grep -v "as the .root. user"
  python -c 'import hal; print(hal.probe().to_json())' > "$OUT/probe.json"

  echo "== build (both ISA builds in parallel)"
  start=$(date +%s)
  python -c 'from backends.cpu_brgemm.extension import ops; print(ops("avx512bf16").isa_name(), ops("avx512bf16").brgemm_packs_bf16())' &
  python -c 'from backends.cpu_brgemm.extension import ops; print(ops("avx2").isa_name())' &
  wait
  echo "build took $(( $(date +%s) - start )) s"

  if [ -z "${SKIP_TESTS:-}" ]; then
    echo "== tests"
    python -m pytest -q -rs tests/cpu_brgemm 2>&1 | tee "$OUT/tests.txt" | tail -15
  fi

  echo "== bench"
  if [ "${BENCH:-full}" = quick ]; then TOKENS=1,16,64,256; fi
  bench() {  # name, then hal bench arguments
    local name=$1; shift
    echo "-- $name"
    python -m hal.cli.main bench moe "$@" --backend cpu_brgemm --tokens "$TOKENS" --routing "$ROUTING" \
      --threads "$THREADS" --iters "$ITERS" --out "$OUT/bench_$name.json" 2>&1 | grep -v '^\[hal bench\] .* us$'
  }
  for model in ${MODELS:-qwen3_fp8 gptoss20b_mxfp4 dsv3_fp8_ep32}; do
    case $model in
      qwen3_fp8) bench qwen3_fp8 --model qwen3-30b-a3b --format fp8_block128 ;;
      gptoss20b_mxfp4) bench gptoss20b_mxfp4 --model gpt-oss-20b ;;
      dsv3_fp8_ep32) bench dsv3_fp8_ep32 --model deepseek-v3 --format fp8_block128 --local-experts 32 ;;
    esac
  done
  date -u
} 2>&1 | tee "$OUT/log.txt"
