#!/usr/bin/env bash
# llama-server's own test suite against `fly-cpp serve`: see scripts/llama_server_suite.py.
#   scripts/llama-server-suite.sh [--fast] [FILE...] [--json OUT]
exec python "$(dirname "$0")/llama_server_suite.py" "$@"
