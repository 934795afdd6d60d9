#!/usr/bin/env bash
# Build helm from the module pinned in hack/helm, the way hack/kube/build.sh builds kubectl.
#
# The program goes into its own cache directory, keyed by the pinned version and a hash of the
# pins, beside (not inside) the control plane's: a change here never invalidates that slower
# build, and a fresh clone on a warm machine rebuilds nothing. The directory is the last line
# printed; the program is bin/helm in it. `build.sh --dir` prints it without building.
#
#   HELM_BIN_CACHE   where keyed directories live (default: $XDG_CACHE_HOME/nodeagent/helm)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${HELM_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent/helm}

helm=$(awk '$1 == "helm.sh/helm/v4" && $2 ~ /^v/ { print $2; exit }
  $1 == "require" && $2 == "helm.sh/helm/v4" { print $3; exit }' "$here/go.mod")
pins=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
dir="$cache_root/helm-$helm-$pins"

if [ "${1:-}" = "--dir" ]; then
  echo "$dir"
  exit 0
fi

# Keyed directories nothing has used for two weeks are left over from older pins.
if [ -d "$cache_root" ]; then
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -path "$dir" -mtime +14 \
    -exec rm -rf {} + 2>/dev/null || true
fi

if [ -f "$dir/complete" ]; then
  touch "$dir"
  echo "helm is current ($helm)" >&2
  echo "$dir"
  exit 0
fi

command -v go >/dev/null || { echo "go is not installed; install Go 1.26 or newer" >&2; exit 2; }
mkdir -p "$dir/bin"
start=$(date +%s)
echo "building helm $helm (a cold build takes a few minutes)..." >&2
# Stamp the version as helm's own Makefile does; a module build otherwise reports the bare
# minor version, and `helm version` is what users compare against NVIDIA's install docs.
(cd "$here" && go build -trimpath \
  -ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$helm \
    -X helm.sh/helm/v4/internal/version.gitTreeState=clean" -o "$dir/bin/" tool)
[ -x "$dir/bin/helm" ] || { echo "build did not produce helm" >&2; exit 1; }
printf 'helm %s\nbuilt %s in %ss\n' "$helm" "$(date -u +%FT%TZ)" "$(($(date +%s) - start))" \
  >"$dir/complete"
echo "built in $(($(date +%s) - start)) s; $(du -sh "$dir" | cut -f1) in $dir" >&2
echo "$dir"
