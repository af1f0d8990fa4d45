#!/bin/sh
# Archive one run folder into results/AREA/DATE-NAME.tar.gz, deterministically.
#
# Usage: results/archive.sh AREA RUN_FOLDER [DATE]
#   AREA        benchmarks, control-plane, ... (a folder under results/)
#   RUN_FOLDER  the folder a tool wrote (hetero-bench run's runs/bench/SCENARIO-STAMP,
#               hetero-bench load's --out, a script's OUT)
#   DATE        YYYY-MM-DD the run was taken; default: a date that leads the folder's
#               name (2026-11-28-shared-box), else today (UTC)
#
# NAME is the folder's name without a leading date. The archive holds one top folder,
# NAME/, with the run's files as the tools wrote them. Names are sorted, times, owners
# and modes fixed, and gzip stores no name or time, so archiving the same files again
# gives the same bytes. Read one with: tar xzf results/AREA/DATE-NAME.tar.gz
set -eu

usage="usage: results/archive.sh AREA RUN_FOLDER [DATE]"
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "$usage" >&2; exit 2; }
area=$1
src=$2
[ -d "$src" ] || { echo "error: $src is not a folder" >&2; exit 2; }
case $area in
    */* | .* | "") echo "error: AREA is one folder name, got '$area'" >&2; exit 2 ;;
esac

base=$(basename "$(cd "$src" && pwd)")
lead=$(printf '%s\n' "$base" | sed -n 's/^\([0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}\)-.*/\1/p')
date=${3:-${lead:-$(date -u +%Y-%m-%d)}}
printf '%s\n' "$date" | grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' \
    || { echo "error: DATE must be YYYY-MM-DD, got '$date'" >&2; exit 2; }
name=${base#"$lead"-}
[ -n "$lead" ] || name=$base

here=$(cd "$(dirname "$0")" && pwd)
dest=$here/$area/$date-$name.tar.gz
mkdir -p "$here/$area"
parent=$(cd "$src/.." && pwd)
base_re=$(printf '%s\n' "$base" | sed 's/[][\\.*^$,]/\\&/g')

# --transform renames the top folder to NAME inside the archive, the files stay as they are.
LC_ALL=C tar --format=gnu --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    --mode='u+rwX,go+rX,go-w' --transform "s,^$base_re,$name," \
    -C "$parent" -cf - "$base" | gzip -n -9 > "$dest.tmp"
mv "$dest.tmp" "$dest"
echo "$dest ($(wc -c < "$dest") bytes)"
