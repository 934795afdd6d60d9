#!/usr/bin/env bash
# Build the node programs the real-kubelet tests run: the kubelet of the Kubernetes version
# hack/kube/k8s pins (from hack/kube/node, a module of its own so that changing the node side
# never rebuilds the control plane) and fakecri, Kubernetes' fake CRI runtime served on a unix
# socket (hack/kube/node/fakecri).
#
# Cached like build.sh: a directory keyed by the Kubernetes version and a hash of the module's
# files, outside the checkout. The directory is the last line printed; `--dir` prints it without
# building.
#
#   KUBE_BINS_CACHE   where keyed directories live (default: $XDG_CACHE_HOME/nodeagent/kube)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${KUBE_BINS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent/kube}

k8s=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }
  $1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$here/node/go.mod")
control_plane=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }
  $1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$here/k8s/go.mod")
if [ "$k8s" != "$control_plane" ]; then
  # A kubelet newer or older than the API server is a skew test, not what these tests mean.
  echo "hack/kube/node pins Kubernetes $k8s but hack/kube/k8s pins $control_plane; pin the same" >&2
  exit 2
fi
pins=$(cat "$here"/node/go.mod "$here"/node/go.sum "$here"/node/fakecri/*.go "$here/build-node.sh" |
  sha256sum | cut -c1-12)
dir="$cache_root/node-$k8s-$pins"

if [ "${1:-}" = "--dir" ]; then
  echo "$dir"
  exit 0
fi

if [ -d "$cache_root" ]; then
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d -name 'node-*' ! -path "$dir" -mtime +14 \
    -exec rm -rf {} + 2>/dev/null || true
fi

if [ -f "$dir/complete" ]; then
  touch "$dir"
  echo "node programs are current (kubelet $k8s, fakecri)" >&2
  echo "$dir"
  exit 0
fi

command -v go >/dev/null || { echo "go is not installed; install Go 1.26 or newer" >&2; exit 2; }
mkdir -p "$dir/bin"
start=$(date +%s)
echo "building kubelet $k8s and fakecri (about 2 minutes after the control plane's build)..." >&2
minor=${k8s#v1.}; minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(cd "$here/node" && go build -trimpath -ldflags="-s -w$stamp" -o "$dir/bin/" tool ./fakecri)
for program in kubelet fakecri; do
  [ -x "$dir/bin/$program" ] || { echo "build did not produce $program" >&2; exit 1; }
done
printf 'kubelet %s\nbuilt %s in %ss\n' "$k8s" "$(date -u +%FT%TZ)" "$(($(date +%s) - start))" \
  >"$dir/complete"
echo "built in $(($(date +%s) - start)) s; $(du -sh "$dir" | cut -f1) in $dir" >&2
echo "$dir"
