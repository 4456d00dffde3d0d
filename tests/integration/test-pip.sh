#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pip install . from the source tree into a fresh virtual environment (with
# Debian's torch through --system-site-packages), as a user would: the
# package builds through meson (meson-python, from PyPI), import psnet finds
# the libpsnet inside it with no environment variable, the daemons are on the
# environment's PATH, and examples/quickstart.py trains on a LocalCluster of
# those daemons.
source "$(dirname "$0")/lib.sh"

if ldd "$PSNET_BUILD/worker/client/libpsnet.so" | grep -q libasan; then
  # pip builds its own release build, the same in both passes.
  TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - pip install . # SKIP the install builds its own release build: checked in the normal build's pass"
  exit 0
fi

venv=$RUN/venv
# No PYTHONPATH, PSNET_LIB or PSNET_BUILD: what a user's shell has; the
# machine's proxy and package index settings pass.
clean=(env -i "HOME=$RUN" "PATH=$venv/bin:/usr/bin:/bin" "TMPDIR=${TMPDIR:-/tmp}")
for v in http_proxy https_proxy HTTP_PROXY HTTPS_PROXY no_proxy NO_PROXY PIP_INDEX_URL PIP_EXTRA_INDEX_URL \
         PIP_TRUSTED_HOST PIP_CONFIG_FILE SSL_CERT_FILE REQUESTS_CA_BUNDLE; do
  [ -n "${!v:-}" ] && clean+=("$v=${!v}")
done
/usr/bin/python3 -m venv --system-site-packages "$venv" >"$RUN/venv.log" 2>&1
ok $? "a fresh virtual environment with Debian's python3 and its torch"
# The build dependencies (meson-python, meson) come from the package index:
# without it there is nothing to install with, and the test says so.
if ! (cd "$RUN" && timeout 120 "${clean[@]}" "$venv/bin/pip" download --no-input --disable-pip-version-check \
        --no-deps -d "$RUN/probe" meson-python) >"$RUN/probe.log" 2>&1; then
  TAP_N=$((TAP_N + 1))
  echo "ok $TAP_N - pip install . # SKIP the package index cannot be reached ($(tail -n 1 "$RUN/probe.log"))"
  exit 0
fi
(cd "$RUN" && "${clean[@]}" "$venv/bin/pip" install --no-input --disable-pip-version-check "$PSNET_SRC") \
  >"$RUN/pip.log" 2>&1
ok $? "pip install . builds and installs psnet ($(grep -m1 -o 'Successfully installed.*' "$RUN/pip.log" || tail -n 2 "$RUN/pip.log" | tr '\n' ' '))"

lib=$(cd / && "${clean[@]}" "$venv/bin/python" -c 'import psnet.client as c; c._load(); print(c._find_library())' 2>"$RUN/import.log")
[[ "$lib" == "$venv"/lib/python3*/site-packages/psnet/libpsnet.so ]]
ok $? "import psnet loads the libpsnet inside the package, no environment variable set ($lib)"
want=$(sed -n "s/^  version: '\([^']*\)',/\1/p" "$PSNET_SRC/meson.build")
got=$(cd / && "${clean[@]}" "$venv/bin/python" -c 'import psnet; print(psnet.__version__)')
[ -n "$want" ] && [ "$got" = "$want" ]; ok $? "the package's version is meson.build's ($got, $want)"
mods=$(cd "$PSNET_SRC/python" && ls psnet/*.py | sed 's|/|.|; s|\.py$||' | tr '\n' ' ')
out=$(cd / && "${clean[@]}" "$venv/bin/python" -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" $mods 2>&1)
ok $? "every module of python/psnet imports from the installed package ($mods${out:+: $(tail -n 1 <<<"$out")})"
for p in pscoord psd psctl psgate workerd; do
  [ -x "$venv/bin/$p" ] && "$venv/bin/$p" --version >/dev/null 2>&1 || { ok 1 "$p on the environment's PATH"; continue; }
  ok 0 "$p on the environment's PATH ($("$venv/bin/$p" --version 2>&1 | head -n 1))"
done

(cd / && "${clean[@]}" "$venv/bin/python" "$PSNET_SRC/examples/quickstart.py" --limit 2000 --epochs 1) \
  >"$RUN/quickstart.out" 2>"$RUN/quickstart.log"; rc=$?
line=$(grep -m1 'epoch 1: test accuracy' "$RUN/quickstart.out")
[ $rc -eq 0 ] && accuracy_at_least "${line/test accuracy /accuracy=}" 0.65
ok $? "examples/quickstart.py trains on a LocalCluster of the installed daemons ($line; >= 0.65 on 2000 images)"
grep -q "$venv/bin/pscoord" <(cd / && "${clean[@]}" "$venv/bin/python" -c 'import psnet.cluster as c; print(c.find_program("pscoord"))')
ok $? "LocalCluster runs the environment's pscoord"
