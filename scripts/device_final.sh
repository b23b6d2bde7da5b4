#!/usr/bin/env bash
# On a GPU host without network: `hal probe` as an operator sees it, the ceilings `hal bench`
# measures, and `tox -e cuda` on the image's packages. tox and its dependencies come as wheels in
# .whl/; results land in $OUT.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/device-final}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.txt" 2>&1
{ time hal probe; } >"$OUT/probe.txt" 2>&1
python3 -c "from hal.bench.ceilings import measure; print(measure('cuda:0').describe())" \
    >"$OUT/ceilings.txt" 2>&1
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
PYTHONPATH="/tmp/site:$site" timeout "${TOX_TIMEOUT:-140}" python3 -m tox -e cuda -- "$@" \
    -q -p no:cacheprovider >"$OUT/tox.txt" 2>&1
echo "tox rc=$?" >>"$OUT/tox.txt"
tail -5 "$OUT/probe.txt" "$OUT/ceilings.txt"; tail -25 "$OUT/tox.txt"
