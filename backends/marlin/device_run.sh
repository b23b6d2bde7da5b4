#!/usr/bin/env bash
# The Marlin backend on a GPU host: build the specializations the tests need (in parallel), run the
# CUDA tests, compute-sanitizer memcheck, and `hal bench` on the three issue-5 shapes.
#   backends/marlin/device_run.sh [steps]    steps: comma list of build,test,memcheck,bench,quickbench
# Logs and JSON go to $OUT (default ./marlin-out).
set -o pipefail
STEPS=",${1:-build,test,memcheck,bench},"
OUT=${OUT:-$PWD/marlin-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export HAL_CACHE_DIR=${HAL_CACHE_DIR:-$PWD/.hal-cache}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
want() { [[ $STEPS == *",$1,"* ]]; }

python -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/pip.txt" 2>&1 || tail -5 "$OUT/pip.txt"
python -c "from importlib.metadata import entry_points as e; print('entry points:', sorted(x.name for x in e(group='hal.backends')))"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

if want build; then
  # One process per specialization: hal.jit serializes builds inside a process, not across them.
  time python - <<'EOF' 2>&1 | tee "$OUT/build.txt"
import concurrent.futures as cf
import hal
from backends.marlin import configs
from backends.marlin.kernel import MarlinMoEKernel
from hal.backend import Target

SPECS = [("bfloat16", False, False), ("bfloat16", True, True), ("bfloat16", True, False), ("float16", True, False),
         ("float16", False, True)]

def build(key):
    dtype, ep, bias = key
    spec = hal.MoESpec(64, 2, 256, 128, "int4_g128", has_bias=bias, act_dtype=dtype,
                       num_local_experts=32 if ep else None)
    kernel = MarlinMoEKernel(spec, Target("cuda:0", hal.probe(deep=True)))
    kernel.compile()
    table = kernel.kernel_attributes()
    rows = [f"  {c.describe():<24} regs {table[c.index].num_regs:3d} smem "
            f"{table[c.index].static_smem + table[c.index].dynamic_smem:6d} local {table[c.index].local_bytes}"
            for c in configs.candidates()]
    return kernel.specialization.describe() + "\n" + "\n".join(rows)

with cf.ProcessPoolExecutor(len(SPECS)) as pool:
    for text in pool.map(build, SPECS):
        print(text)
EOF
fi

if want test; then
  python -m pytest -q -rs tests/marlin -k "not memcheck" 2>&1 | tee "$OUT/pytest.txt"
fi

if want memcheck; then
  python -m pytest -q -rs tests/marlin -k memcheck 2>&1 | tee "$OUT/memcheck.txt"
fi

bench() {  # name, then hal bench arguments
  local name=$1; shift
  python -m hal.cli.main bench moe --device cuda --format int4_g128 --out "$OUT/bench_$name.json" "$@" \
    >"$OUT/bench_$name.stdout" 2>"$OUT/bench_$name.log"
  echo "bench $name rc=$?"; tail -3 "$OUT/bench_$name.log"
  python -m backends.marlin.bench_table "$OUT/bench_$name.json" | tee "$OUT/table_$name.txt"
}

if want quickbench; then
  bench mixtral-quick --model mixtral-8x7b --tokens 1,8,32,64,256,2048 --no-reference --iters 10
  bench qwen3-quick --model qwen3-30b-a3b --tokens 1,8,32,64,256,2048 --no-reference --iters 10
  bench deepseek-ep8-quick --model deepseek-v3 --local-experts 32 --tokens 1,8,32,64,256,2048 --no-reference --iters 10
fi

if want bench; then
  bench mixtral --model mixtral-8x7b --tokens 1,8,32,64,256,2048 --iters 10
  bench qwen3 --model qwen3-30b-a3b --tokens 1,8,32,64,256,2048 --iters 10
  bench deepseek-ep8 --model deepseek-v3 --local-experts 32 --tokens 1,8,32,64,256,2048 --iters 10
  python - <<'EOF' 2>&1 | tee "$OUT/plans.txt"
import hal
from backends.marlin import backend
from hal.backend import Target
from hal.presets import PRESETS

target = Target("cuda:0", hal.probe(deep=True))
for spec in (PRESETS["mixtral-8x7b"].spec("int4_g128"), PRESETS["qwen3-30b-a3b"].spec("int4_g128"),
             PRESETS["deepseek-v3"].spec("int4_g128", num_local_experts=32)):
    kernel = backend.build(spec, target)
    for variant, k in [("marlin", kernel), *kernel.baselines().items()]:
        for tokens in (1, 8, 32, 64, 256, 2048):
            print(f"{spec.hidden_size}x{spec.intermediate_size} {variant}: {k.plan(tokens).describe()}")
EOF
fi
