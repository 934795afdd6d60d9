#!/usr/bin/env bash
# Build the pinned Kubernetes control plane the integration tests run on: kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl and etcd from hack/kube/k8s (Kubernetes
# modules), and the Kueue manager from hack/kube/kueue (its own module, as upstream builds it).
#
# The programs go into a cache directory keyed by the pinned versions and a hash of the pins,
# outside the checkout so that a fresh clone on a warm machine rebuilds nothing; Kueue's CRDs and
# webhook manifests, and the CRDs of the Kueue integrations that request templates check (JobSet,
# RayJob and RayCluster, the Kubeflow jobs, LeaderWorkerSet; the versions Kueue's module
# requires), are copied beside them from the module cache. The directory is the last line
# printed. `build.sh --dir` prints it without building.
#
#   KUBE_BINS_CACHE   where keyed directories live (default: $XDG_CACHE_HOME/nodeagent/kube)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${KUBE_BINS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent/kube}

version_of() { # module go.mod -> the version go.mod requires
  awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$2"
}
k8s=$(version_of k8s.io/kubernetes "$here/k8s/go.mod")
etcd=$(version_of go.etcd.io/etcd/server/v3 "$here/k8s/go.mod")
kueue=$(version_of sigs.k8s.io/kueue "$here/kueue/go.mod")
pins=$(cat "$here"/k8s/go.mod "$here"/k8s/go.sum "$here"/kueue/go.mod "$here"/kueue/go.sum \
  "$here/build.sh" | sha256sum | cut -c1-12)
dir="$cache_root/k8s-$k8s-etcd-$etcd-kueue-$kueue-$pins"

if [ "${1:-}" = "--dir" ]; then
  echo "$dir"
  exit 0
fi

# Keyed directories nothing has used for two weeks are left over from older pins.
if [ -d "$cache_root" ]; then
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -path "$dir" -mtime +14 \
    -exec rm -rf {} + 2>/dev/null || true
fi

programs=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kueue)
if [ -f "$dir/complete" ]; then
  touch "$dir"
  echo "control plane programs are current (Kubernetes $k8s, etcd $etcd, Kueue $kueue)" >&2
  echo "$dir"
  exit 0
fi

command -v go >/dev/null || { echo "go is not installed; install Go 1.26 or newer" >&2; exit 2; }
mkdir -p "$dir/bin" "$dir/kueue"
start=$(date +%s)
echo "building Kubernetes $k8s and etcd $etcd (a cold build takes 10-30 minutes)..." >&2
# Stamp the version the way Kubernetes' own build does (hack/lib/version.sh): programs built
# from modules otherwise report v0.0.0-master, which clients such as Kueue refuse to parse.
minor=${k8s#v1.}; minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(cd "$here/k8s" && go build -trimpath -ldflags="-s -w$stamp" -o "$dir/bin/" tool)
# go build names etcd's root package after its module path (".../server/v3" -> "server").
mv "$dir/bin/server" "$dir/bin/etcd"
echo "building Kueue $kueue..." >&2
(cd "$here/kueue" && go build -trimpath \
  -ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue" -o "$dir/bin/" tool)

kueue_src=$(cd "$here/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
cp "$kueue_src"/config/components/crd/bases/*.yaml "$dir/kueue/"
cp "$kueue_src/config/components/webhook/manifests.yaml" "$dir/kueue/webhooks.yaml"
# module, then its CRD files
integrations=(
  "sigs.k8s.io/jobset config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
  "github.com/ray-project/kuberay/ray-operator config/crd/bases/ray.io_rayjobs.yaml
    config/crd/bases/ray.io_rayclusters.yaml"
  "github.com/kubeflow/training-operator manifests/base/crds/kubeflow.org_pytorchjobs.yaml
    manifests/base/crds/kubeflow.org_tfjobs.yaml manifests/base/crds/kubeflow.org_xgboostjobs.yaml
    manifests/base/crds/kubeflow.org_paddlejobs.yaml manifests/base/crds/kubeflow.org_jaxjobs.yaml"
  "github.com/kubeflow/mpi-operator manifests/base/kubeflow.org_mpijobs.yaml"
  "sigs.k8s.io/lws config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
  "github.com/kubeflow/trainer/v2 manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml"
)
mkdir -p "$dir/integrations"
for entry in "${integrations[@]}"; do
  read -r -d '' module files <<<"$entry" || true
  # Kueue's build fetched these modules already; downloading again is a no-op then, and makes
  # sure of them otherwise (go list names no directory for a module not yet fetched).
  src=$(cd "$here/kueue" && go mod download "$module" && go list -m -f '{{.Dir}}' "$module")
  for file in $files; do cp "$src/$file" "$dir/integrations/"; done
done
chmod -R u+w "$dir/kueue" "$dir/integrations"

for program in "${programs[@]}"; do
  [ -x "$dir/bin/$program" ] || { echo "build did not produce $program" >&2; exit 1; }
done
printf 'kubernetes %s\netcd %s\nkueue %s\nbuilt %s in %ss\n' "$k8s" "$etcd" "$kueue" \
  "$(date -u +%FT%TZ)" "$(($(date +%s) - start))" >"$dir/complete"
echo "built in $(($(date +%s) - start)) s; $(du -sh "$dir" | cut -f1) in $dir" >&2
echo "$dir"
