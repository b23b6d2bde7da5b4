#!/bin/bash
# On a GPU host: install, capture profiles, run the probe tests, record nvidia-smi and lscpu (all
# under $OUT).
set -o pipefail
pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/pip.txt" 2>&1
export PYTHONPATH=$PWD  # the checkout wins even where the editable install did not take
export PYTHONUNBUFFERED=1
{ nvidia-smi -q | head -60; echo; lscpu; } >"$OUT/host.txt" 2>&1
python3 scripts/capture_profile.py --name h200 --cpu-name emerald-rapids --bandwidth --out "$OUT" 2>&1 | tee "$OUT/log.txt"
python3 -m pytest -q -p no:cacheprovider -rs tests/probe/test_live_probe.py tests/probe/test_fork_cuda.py tests/probe/test_parsers.py 2>&1 | tail -25 | tee -a "$OUT/log.txt"
