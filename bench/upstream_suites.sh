#!/usr/bin/env bash
# Runs commaai/msgq's own Python suites, unchanged, against our msgq and msgq.visionipc.
#
#   bench/upstream_suites.sh SOURCE [pytest args...]
#
# SOURCE is a local commaai/msgq checkout (its work tree) or its git directory (a bare clone or mirror: the
# suites are read from HEAD with `git archive`). Nothing is fetched. The suites run from a scratch copy, in
# pytest's importlib mode and with an empty config, so neither the checkout's own msgq/ package (uncompiled
# Cython) nor its pytest settings shadow ours, in a fresh OPENPILOT_PREFIX that is removed afterwards.
# Suites: msgq/tests/test_messaging.py, test_poller.py, test_fake.py, msgq/visionipc/tests/test_visionipc.py.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
if [ $# -lt 1 ]; then
  echo "usage: $0 MSGQ_CHECKOUT_OR_GIT_DIR [pytest args...]" >&2
  exit 2
fi
source="$1"
shift
suites=(msgq/tests/test_messaging.py msgq/tests/test_poller.py msgq/tests/test_fake.py
        msgq/visionipc/tests/test_visionipc.py)

scratch="$(mktemp -d)"
prefix="upstream$$"
cleanup() {
  rm -rf "$scratch" "/dev/shm/msgq_$prefix"
  OPENPILOT_PREFIX="$prefix" "$python" -c 'import shutil; from msgq import namespace; shutil.rmtree(namespace.runtime_dir_path(), ignore_errors=True)'
}
trap cleanup EXIT

# one flat directory outside any msgq/ path: pytest names the modules after it, so nothing claims "msgq.*"
mkdir "$scratch/from_checkout" "$scratch/suites"
if [ -d "$source/msgq/tests" ]; then
  for s in "${suites[@]}"; do
    mkdir -p "$scratch/from_checkout/$(dirname "$s")"
    cp "$source/$s" "$scratch/from_checkout/$s"
  done
elif git --git-dir="$source" rev-parse --verify -q HEAD >/dev/null; then
  git --git-dir="$source" archive HEAD "${suites[@]}" | tar -x -C "$scratch/from_checkout"
else
  echo "$0: $source is neither a commaai/msgq checkout nor its git directory" >&2
  exit 2
fi
for s in "${suites[@]}"; do
  cp "$scratch/from_checkout/$s" "$scratch/suites/"
done
touch "$scratch/pytest.ini"

# run from our checkout: `python -m pytest` puts the working directory first on sys.path, and there msgq is ours
cd "$repo"
OPENPILOT_PREFIX="$prefix" "$python" -m pytest -c "$scratch/pytest.ini" --rootdir "$scratch" --import-mode=importlib \
  -p no:cacheprovider -q -rfE "$@" "$scratch/suites"
