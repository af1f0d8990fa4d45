#!/bin/sh
# A Debian bookworm base image with Python 3 for the Dockerfile's PYTHON_IMAGE, made
# without a registry: debootstrap (minbase + python3, python3-venv) from a Debian mirror,
# then `podman import`. Root only (debootstrap). Usage:
#   docker/debian-base.sh [IMAGE]        # default localhost/hetero-base:bookworm
# DEBIAN_MIRROR picks the mirror (default http://deb.debian.org/debian). An image that
# exists already is kept (podman rmi it to rebuild).
set -eu
image=${1:-localhost/hetero-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if podman image exists "$image"; then
  echo ">> $image exists"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "error: debootstrap not found (apt-get install debootstrap)" >&2; exit 2; }
root=$(mktemp -d /var/tmp/hetero-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo ">> debootstrap bookworm into $root (a few minutes)"
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# Package lists, caches and docs are no use in an image.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/*
tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$image" >/dev/null
echo ">> $image: $(podman image inspect --format '{{.Size}}' "$image") bytes"
