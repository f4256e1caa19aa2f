#!/usr/bin/env bash
# The whole test suite, from a fresh clone: sets up .venv with the project and its
# test dependencies (the Spark tests also need a Java 17+ runtime; without one they
# skip, saying so), then runs pytest. Extra arguments go to pytest.
# Exit code: pytest's, except that "no test ran" (5) counts as a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,s3,hdfs,spark,gcs,azure]'

# Azurite (Microsoft's Blob Storage emulator, from npm) for the Azure binding's tests, into
# the git-ignored .azurite/ (tests/support/azurite.py finds it there); only when not yet
# there. Without Node.js/npm the Azure tests skip, saying so.
if [ ! -f .azurite/node_modules/azurite/dist/src/blob/main.js ] && command -v npm >/dev/null; then
    npm install --prefix .azurite --no-audit --no-fund --silent azurite@3.37.0
fi

# Lint, format and types first (seconds); the tests run either way, the exit code counts all.
checks=0
.venv/bin/ruff check --quiet . || checks=1
.venv/bin/ruff format --check --quiet . || checks=1
bash .ci/typecheck || checks=1

# The compiled accelerators are built by the install above (gcc and the Python headers are
# on the machines CI runs on): tests that run both them and the pure-Python code fail,
# rather than skip, where they are missing.
export SLTS_REQUIRE_NATIVE=1

# Two workers (the machine CI runs on has two cores; each worker starts its own servers);
# `-n 0` after it runs everything in one process.
status=0
.venv/bin/python -m pytest -n 2 "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "tests/run.sh: pytest collected no tests; that is a failure" >&2
    exit 1
fi
if [ "$status" -eq 0 ] && [ "$checks" -ne 0 ]; then
    echo "tests/run.sh: the tests passed, but ruff or mypy found problems (above)" >&2
    exit 1
fi
exit "$status"
