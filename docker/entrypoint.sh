#!/bin/sh
# Choose the daemon: `coordinator` or `agent` (default); `health` (the image's HEALTHCHECK);
# or run any other command.
#   HETERO_LISTEN       the coordinator's gRPC address (default 0.0.0.0:7070)
#   HETERO_COORDINATOR  the coordinator an agent reports to (else its --coordinator flag)
#   HETERO_TOKEN, HETERO_TOKEN_FILE  the cluster's token (docs/reliability.md#security)
set -e
case "${1:-agent}" in
  coordinator|coord)
    [ $# -gt 0 ] && shift
    exec hetero-coord serve --listen "${HETERO_LISTEN:-0.0.0.0:7070}" --state-dir /var/lib/hetero "$@"
    ;;
  agent)
    [ $# -gt 0 ] && shift
    if [ -n "${HETERO_COORDINATOR:-}" ]; then
      set -- --coordinator "$HETERO_COORDINATOR" "$@"
    fi
    exec hetero-agent run --state-dir /var/lib/hetero "$@"
    ;;
  health)
    # gRPC health (grpc.health.v1.Health/Check) of the coordinator this container serves,
    # or else of the one its agent reports to.
    if tr '\0' ' ' < /proc/1/cmdline | grep -q 'hetero-coord serve'; then
      listen="${HETERO_LISTEN:-0.0.0.0:7070}"
      exec hetero-coord health --coordinator "127.0.0.1:${listen##*:}" --timeout 5
    fi
    exec hetero-coord health --coordinator "${HETERO_COORDINATOR:-127.0.0.1:7070}" --timeout 5
    ;;
  *)
    exec "$@"
    ;;
esac
