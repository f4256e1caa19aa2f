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
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,s3,hdfs,spark]'

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "tests/run.sh: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit "$status"
