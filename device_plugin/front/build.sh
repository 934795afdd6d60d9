#!/usr/bin/env bash
# Build nodeagent-device-plugin-front, the Go program that answers the kubelet's Allocate for
# the agent (docs/device-plugin.md), into a cache directory keyed by its sources, so a fresh
# clone on a warm machine rebuilds nothing. The last line printed is the program's path;
# `build.sh --path` prints it without building.
#
#   DEVICE_PLUGIN_FRONT_CACHE   where keyed directories live
#                               (default: $XDG_CACHE_HOME/nodeagent/front)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${DEVICE_PLUGIN_FRONT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent/front}
key=$(cat "$here"/go.mod "$here"/go.sum "$here"/*.go "$here/build.sh" | sha256sum | cut -c1-12)
dir="$cache_root/front-$key"
program="$dir/nodeagent-device-plugin-front"

if [ "${1:-}" = "--path" ]; then
  echo "$program"
  exit 0
fi
if [ -d "$cache_root" ]; then
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -path "$dir" -mtime +14 \
    -exec rm -rf {} + 2>/dev/null || true
fi
if [ -x "$program" ]; then
  touch "$dir"
  echo "the device plugin front is current" >&2
  echo "$program"
  exit 0
fi
command -v go >/dev/null || { echo "go is not installed; install Go 1.26 or newer" >&2; exit 2; }
mkdir -p "$dir"
start=$(date +%s)
(cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$program.partial" .)
mv "$program.partial" "$program"
echo "built the device plugin front in $(($(date +%s) - start)) s" >&2
echo "$program"
