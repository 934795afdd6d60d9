#!/usr/bin/env bash
# Build NVIDIA's device plugin and nvidia-ctk from the modules pinned in hack/nvidia, the way
# hack/helm/build.sh builds helm. They are test peers only: tests and benchmarks run them on a
# simulated node (nodeagent/sim/libnvml), nothing ships them.
#
# The programs go into one cache directory keyed by the pins, so a fresh clone on a warm
# machine rebuilds nothing. The directory is the last line printed; the programs are
# bin/nvidia-device-plugin and bin/nvidia-ctk in it. `build.sh --dir` prints it without
# building; `build.sh --nvml-header` prints the path of nvml.h in the go-nvml module that
# nvidia-ctk is pinned to (downloading the module when needed).
#
#   NVIDIA_PEERS_CACHE   where keyed directories live (default: $XDG_CACHE_HOME/nodeagent/nvidia)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${NVIDIA_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent/nvidia}
pins=$(cat "$here"/device-plugin/go.mod "$here"/device-plugin/go.sum "$here"/ctk/go.mod \
  "$here"/ctk/go.sum "$here/build.sh" | sha256sum | cut -c1-12)
dir="$cache_root/peers-$pins"

need_go() {
  command -v go >/dev/null || { echo "go is not installed; install Go 1.26 or newer" >&2; exit 2; }
}

case "${1:-}" in
--dir)
  echo "$dir"
  exit 0
  ;;
--nvml-header)
  need_go
  mod=$(cd "$here/ctk" && go mod download github.com/NVIDIA/go-nvml >/dev/null &&
    go list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml)
  [ -f "$mod/pkg/nvml/nvml.h" ] || { echo "no pkg/nvml/nvml.h in $mod" >&2; exit 1; }
  echo "$mod/pkg/nvml/nvml.h"
  exit 0
  ;;
esac

if [ -d "$cache_root" ]; then
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -path "$dir" -mtime +14 \
    -exec rm -rf {} + 2>/dev/null || true
fi
if [ -f "$dir/complete" ]; then
  touch "$dir"
  echo "NVIDIA's device plugin and nvidia-ctk are current" >&2
  echo "$dir"
  exit 0
fi

need_go
mkdir -p "$dir/bin"
start=$(date +%s)
echo "building NVIDIA's device plugin and nvidia-ctk (a cold build takes a few minutes)..." >&2
# cgo: both link go-nvml, which dlopens libnvidia-ml.so.1 at run time (no link-time NVML).
(cd "$here/device-plugin" && CGO_ENABLED=1 go build -trimpath -ldflags="-s -w" -o "$dir/bin/" tool)
(cd "$here/ctk" && CGO_ENABLED=1 go build -trimpath -ldflags="-s -w" -o "$dir/bin/" tool)
for prog in nvidia-device-plugin nvidia-ctk; do
  [ -x "$dir/bin/$prog" ] || { echo "build did not produce $prog" >&2; exit 1; }
done
printf 'k8s-device-plugin, nvidia-container-toolkit\nbuilt %s in %ss\n' "$(date -u +%FT%TZ)" \
  "$(($(date +%s) - start))" >"$dir/complete"
echo "built in $(($(date +%s) - start)) s; $(du -sh "$dir" | cut -f1) in $dir" >&2
echo "$dir"
