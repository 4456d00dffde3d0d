#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The epsilon psnet reports for a private federated job (psctl privacy: the
# accountant pscoord runs) beside Google's dp-accounting RdpAccountant on the
# same Poisson sampling rate, noise, rounds and delta, over a grid of them;
# prints each pair, their ratio, and the classic conversion psnet used to
# print. dp-accounting is installed into a virtual environment for this
# benchmark only (--venv DIR, default ~/.cache/psnet/dp-venv; needs Debian's
# python3-venv and a network the first time).
#   tests/bench/privacy.sh [--build DIR] [--venv DIR]
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build
venv=${XDG_CACHE_HOME:-$HOME/.cache}/psnet/dp-venv
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    *) echo "privacy: unknown option $1" >&2; exit 2 ;;
  esac
done
PSCTL=$build/ps/psctl/psctl
[ -x "$PSCTL" ] || { echo "privacy: $PSCTL is missing (ninja -C $build)" >&2; exit 1; }
if ! "$venv/bin/python" -c 'import dp_accounting' 2>/dev/null; then
  echo "privacy: installing dp-accounting into $venv (for this benchmark only)" >&2
  /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install -q "dp-accounting>=0.4,<0.5" >&2 ||
    { echo "privacy: could not install dp-accounting" >&2; exit 1; }
fi
echo "q      noise  rounds  delta   psnet_eps  dp_accounting  ratio   classic(old)"
worst=0
while read -r q z t d; do
  ours=$("$PSCTL" --json privacy --fraction "$q" --dp-noise "$z" --rounds "$t" --dp-delta "$d" | jq -r .epsilon)
  old=$("$PSCTL" --json privacy --fraction "$q" --dp-noise "$z" --rounds "$t" --dp-delta "$d" --classic | jq -r .epsilon)
  theirs=$("$venv/bin/python" - "$q" "$z" "$t" "$d" 2>/dev/null <<'PY'
import sys
import dp_accounting as dp
from dp_accounting.rdp import rdp_privacy_accountant as rdp
q, z, t, d = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
a = rdp.RdpAccountant()
a.compose(dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(z)), t))
print(a.get_epsilon(d))
PY
)
  r=$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.4f", a / b }')
  worst=$(awk -v w="$worst" -v r="$r" 'BEGIN { d = r - 1; if (d < 0) d = -d; print (d > w ? d : w) }')
  printf "%-6s %-6s %-7s %-7s %-10.4f %-14.4f %-7s %.4f\n" "$q" "$z" "$t" "$d" "$ours" "$theirs" "$r" "$old"
done <<'GRID'
0.1 1.3 10 1e-5
0.1 1.3 100 1e-5
0.05 0.8 50 1e-5
0.01 1.1 1000 1e-5
0.2 2.0 200 1e-5
1.0 1.0 5 1e-5
0.02 1.0 500 1e-6
0.3 1.5 30 1e-5
GRID
echo "largest difference from dp-accounting: $(awk -v w="$worst" 'BEGIN { printf "%.2f%%", 100 * w }') (target: within 1%)"
