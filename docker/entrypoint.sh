#!/bin/sh
# Choose the daemon: `coordinator` or `agent` (default), or run any other command.
set -e
case "${1:-agent}" in
  coordinator|coord)
    [ $# -gt 0 ] && shift
    exec hetero-coord serve --listen "${HETERO_LISTEN:-0.0.0.0:7070}" --state-dir /var/lib/hetero "$@"
    ;;
  agent)
    [ $# -gt 0 ] && shift
    exec hetero-agent run --state-dir /var/lib/hetero "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
