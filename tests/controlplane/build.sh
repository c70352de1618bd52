#!/usr/bin/env bash
# Build the real control plane used by the integration tier, from Go modules, into a per-version cache.
#
#   tests/controlplane/build.sh [--optional] [component...]   (default: all; `make controlplane`)
#
# --optional: when there is no Go toolchain, print one line and exit 0 instead of failing (for CI and
# `make test` on machines that run only the fast tier; the pytest tier then says it did not run).
#
# Components: kube-apiserver kube-controller-manager kubectl etcd helm kuberay-crds (the control plane);
#             kube-scheduler kube-proxy kuberay-operator coredns (the pod-running cluster bed, tests/clusterbed);
#             promtool (the monitoring tier); versitygw (the S3 server of the storage tests).
#             `controlplane` names the first group only.
#
# Nothing is downloaded except through the Go module proxy. Nothing is written into the repository.
# Layout (tests/controlplane/assets.py computes the same paths; keep the two in step):
#
#   $CACHE/controlplane/kubernetes-<v>/bin/{kube-apiserver,kube-controller-manager,kubectl,kube-scheduler,kube-proxy}
#   $CACHE/controlplane/kuberay-<v>/bin/ray-operator      KubeRay's controller (go install .../ray-operator@v)
#   $CACHE/controlplane/kuberay-<v>/config/               its kustomize install (crd/, rbac/, manager/, default/)
#   $CACHE/controlplane/coredns-<v>/bin/coredns           CoreDNS with the plugins a kubeadm Corefile uses
#   $CACHE/controlplane/etcd-<v>/bin/etcd
#   $CACHE/controlplane/helm-<v>/bin/helm
#   $CACHE/controlplane/kuberay-<v>/crds/ray.io_{rayclusters,rayjobs}.yaml
#   $CACHE/controlplane/promtool-<v>/bin/promtool   (the monitoring tier's rule checker and rule tests)
#   $CACHE/controlplane/versitygw-<v>/bin/versitygw (an S3 gateway over a directory: the object-storage tests)
#   $CACHE/controlplane/*/src/             throwaway Go wrapper modules (safe to delete)
#   $CACHE/bin/                            symlinks to the pinned binaries, handy for PATH
#   $CACHE/controlplane/build-times.tsv    how long each build took on this machine
#
# where CACHE = $TRAINOP_CACHE_DIR, else $XDG_CACHE_HOME/trainop, else ~/.cache/trainop.
#
# Why wrapper modules: k8s.io/kubernetes `replace`s every k8s.io/<staging> module with ./staging/src/...,
# which is not in its module zip, so `go install k8s.io/kubernetes/cmd/...@v` refuses it. A wrapper
# module that requires k8s.io/kubernetes and replaces each staging module with its published v0.<minor>
# tag builds the same code. etcd's server module has the same shape (replaces ../api etc.).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
optional=0
if [[ "${1:-}" == --optional ]]; then optional=1; shift; fi
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${TRAINOP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trainop}"
CP_ROOT="$CACHE/controlplane"
K8S_DIR="$CP_ROOT/kubernetes-$K8S_VERSION"
ETCD_DIR="$CP_ROOT/etcd-$ETCD_VERSION"
HELM_DIR="$CP_ROOT/helm-$HELM_VERSION"
KUBERAY_DIR="$CP_ROOT/kuberay-$KUBERAY_VERSION"
COREDNS_DIR="$CP_ROOT/coredns-$COREDNS_VERSION"
PROMTOOL_DIR="$CP_ROOT/promtool-$PROMETHEUS_VERSION"
VERSITYGW_DIR="$CP_ROOT/versitygw-$VERSITYGW_VERSION"

if [[ -n "${GO:-}" ]]; then :
elif command -v go >/dev/null 2>&1; then GO="$(command -v go)"
elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
else
  echo "build.sh: no Go toolchain (looked for \$GO, go on PATH, /usr/local/go/bin/go);" \
    "install Go >= 1.26 or point KUBEBUILDER_ASSETS at prebuilt kube-apiserver/etcd." >&2
  if (( optional )); then
    echo "build.sh: --optional: not building; the controlplane test tier will not run." >&2
    exit 0
  fi
  exit 2
fi

# Static binaries; never let the go command fetch a different toolchain behind our back.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod"

log() { printf '[controlplane-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Run a command, printing a heartbeat every 30s so a multi-minute cold build never looks hung.
with_heartbeat() {
  local label="$1"; shift
  local start=$SECONDS
  "$@" &
  local pid=$! next=30
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (( SECONDS - start >= next )); then
      log "  ... still building $label ($((SECONDS - start))s)"
      next=$((next + 30))
    fi
  done
  wait "$pid"
}

record_time() {  # component version seconds
  mkdir -p "$CP_ROOT"
  printf '%s\t%s\t%s\t%ss\t%s cores\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1" "$2" "$3" "$(nproc)" \
    >>"$CP_ROOT/build-times.tsv"
}

link_into_cache_bin() {  # absolute-path...
  mkdir -p "$CACHE/bin"
  local f
  for f in "$@"; do ln -sfn "$f" "$CACHE/bin/$(basename "$f")"; done
}

module_dir() {  # module@version -> extracted directory in the module cache
  "$GO" mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# ---------------------------------------------------------------------------------------------- k8s
k8s_wrapper() {
  local src="$K8S_DIR/src"
  [[ -f "$src/go.mod" ]] && return 0
  log "preparing Go wrapper module for k8s.io/kubernetes $K8S_VERSION (first time: downloads ~1 GB of modules)"
  local kdir; kdir="$(module_dir "k8s.io/kubernetes@$K8S_VERSION")"
  local minor_patch="${K8S_VERSION#v1.}"                      # 37.2
  local staging_version="v0.$minor_patch"                      # v0.37.2
  mkdir -p "$src.tmp"
  {
    echo "// Generated by trainop tests/controlplane/build.sh; throwaway, safe to delete."
    echo "module trainop.local/controlplane/kubernetes"
    echo
    grep -E '^go [0-9]' "$kdir/go.mod"
    # godebug may be one line or a block; copy it verbatim so runtime defaults match upstream builds.
    awk '/^godebug \(/{b=1} b{print; if ($0 ~ /^\)/) b=0; next} /^godebug /{print}' "$kdir/go.mod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    grep -E '^[[:space:]]*k8s\.io/[^[:space:]]+ => \./staging/src/' "$kdir/go.mod" \
      | awk -v v="$staging_version" '{printf "\t%s => %s %s\n", $1, $1, v}'
    echo ")"
  } >"$src.tmp/go.mod"
  # Resolve the full build list and go.sum once, for every binary we build from this module.
  (cd "$src.tmp" && "$GO" get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-proxy@$K8S_VERSION")
  rm -rf "$src" && mv "$src.tmp" "$src"
}

k8s_ldflags() {
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local flags="-s -w" key val pkg
  # Same variables hack/lib/version.sh sets, so /version, discovery and `kubectl version` report the pin.
  for kv in "gitVersion=$K8S_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
            "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
    key="${kv%%=*}"; val="${kv#*=}"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      flags+=" -X $pkg.$key=$val"
    done
  done
  echo "$flags"
}

build_k8s_binary() {  # kube-apiserver | kube-controller-manager | kubectl | kube-scheduler | kube-proxy
  local name="$1" out="$K8S_DIR/bin/$1"
  if [[ -x "$out" ]]; then log "$name $K8S_VERSION: cached at $out"; link_into_cache_bin "$out"; return 0; fi
  k8s_wrapper
  log "building $name $K8S_VERSION (CGO_ENABLED=0, $(nproc) cores)"
  mkdir -p "$K8S_DIR/bin"
  local start=$SECONDS
  (cd "$K8S_DIR/src" && with_heartbeat "$name" \
      "$GO" build -trimpath -ldflags "$(k8s_ldflags)" -o "$out.tmp" "k8s.io/kubernetes/cmd/$name")
  mv -f "$out.tmp" "$out"
  record_time "$name" "$K8S_VERSION" $((SECONDS - start))
  log "built $name in $((SECONDS - start))s -> $out"
  link_into_cache_bin "$out"
}

# --------------------------------------------------------------------------------------------- etcd
build_etcd() {
  local out="$ETCD_DIR/bin/etcd"
  if [[ -x "$out" ]]; then log "etcd $ETCD_VERSION: cached at $out"; link_into_cache_bin "$out"; return 0; fi
  local src="$ETCD_DIR/src"
  if [[ ! -f "$src/go.mod" ]]; then
    log "preparing Go wrapper module for go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    local edir; edir="$(module_dir "go.etcd.io/etcd/server/v3@$ETCD_VERSION")"
    mkdir -p "$src.tmp"
    {
      echo "// Generated by trainop tests/controlplane/build.sh; throwaway, safe to delete."
      echo "module trainop.local/controlplane/etcd"
      echo
      grep -E '^go [0-9]' "$edir/go.mod"
      echo
      echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
      echo
      echo "replace ("
      # server/go.mod replaces its sibling modules with ../api etc.; use their published tags instead.
      grep -E '^[[:space:]]*go\.etcd\.io/etcd/[^[:space:]]+ => \.\./' "$edir/go.mod" \
        | awk -v v="$ETCD_VERSION" '{printf "\t%s => %s %s\n", $1, $1, v}'
      echo ")"
    } >"$src.tmp/go.mod"
    (cd "$src.tmp" && "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
    rm -rf "$src" && mv "$src.tmp" "$src"
  fi
  log "building etcd $ETCD_VERSION"
  mkdir -p "$ETCD_DIR/bin"
  local start=$SECONDS
  (cd "$src" && with_heartbeat etcd "$GO" build -trimpath -ldflags "-s -w" -o "$out.tmp" go.etcd.io/etcd/server/v3)
  mv -f "$out.tmp" "$out"
  record_time etcd "$ETCD_VERSION" $((SECONDS - start))
  log "built etcd in $((SECONDS - start))s -> $out"
  link_into_cache_bin "$out"
}

# --------------------------------------------------------------------------------------------- helm
build_helm() {
  local out="$HELM_DIR/bin/helm"
  if [[ -x "$out" ]]; then log "helm $HELM_VERSION: cached at $out"; link_into_cache_bin "$out"; return 0; fi
  local major="${HELM_VERSION%%.*}"                             # v4
  local module="helm.sh/helm"; [[ "$major" != v1 && "$major" != v0 ]] && module="helm.sh/helm/$major"
  log "building helm $HELM_VERSION ($module/cmd/helm)"
  mkdir -p "$HELM_DIR/bin" "$HELM_DIR/gobin.tmp"
  local start=$SECONDS
  # helm's go.mod has no replace directives, so plain `go install pkg@version` works (module-aware,
  # outside any main module). The version variable mirrors helm's own Makefile.
  with_heartbeat helm env GOBIN="$HELM_DIR/gobin.tmp" GOFLAGS= "$GO" install -trimpath \
    -ldflags "-s -w -X $module/internal/version.version=$HELM_VERSION -X $module/internal/version.gitTreeState=clean" \
    "$module/cmd/helm@$HELM_VERSION"
  mv -f "$HELM_DIR/gobin.tmp/helm" "$out"
  rmdir "$HELM_DIR/gobin.tmp"
  record_time helm "$HELM_VERSION" $((SECONDS - start))
  log "built helm in $((SECONDS - start))s -> $out"
  link_into_cache_bin "$out"
}

# ------------------------------------------------------------------------------------- kuberay CRDs
fetch_kuberay_crds() {
  local dest="$KUBERAY_DIR/crds"
  if [[ -f "$dest/ray.io_rayjobs.yaml" && -f "$dest/ray.io_rayclusters.yaml" ]]; then
    log "KubeRay CRDs $KUBERAY_VERSION: cached at $dest"; return 0
  fi
  log "fetching KubeRay $KUBERAY_VERSION CRDs from the Go module github.com/ray-project/kuberay/ray-operator"
  local rdir; rdir="$(module_dir "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION")"
  mkdir -p "$dest.tmp"
  cp "$rdir/config/crd/bases/ray.io_rayclusters.yaml" "$rdir/config/crd/bases/ray.io_rayjobs.yaml" "$dest.tmp/"
  chmod 0644 "$dest.tmp"/*.yaml   # the module cache is read-only; our copy need not be
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
  log "KubeRay CRDs -> $dest"
}

# ---------------------------------------------------------------------------------- kuberay operator
# KubeRay's controller has no replace directives: a plain `go install module@version` builds it. Its
# kustomize install (config/default: CRDs, RBAC, the Deployment) is copied next to it, so the cluster bed
# installs KubeRay the way its docs say (`kubectl create -k config/default`), every CRD it watches included.
build_kuberay_operator() {
  local out="$KUBERAY_DIR/bin/ray-operator"
  if [[ -x "$out" && -f "$KUBERAY_DIR/config/default/kustomization.yaml" ]]; then
    log "KubeRay operator $KUBERAY_VERSION: cached at $out"; link_into_cache_bin "$out"; return 0
  fi
  local module="github.com/ray-project/kuberay/ray-operator"
  if [[ ! -x "$out" ]]; then
    log "building KubeRay's controller $KUBERAY_VERSION ($module)"
    mkdir -p "$KUBERAY_DIR/bin" "$KUBERAY_DIR/gobin.tmp"
    local start=$SECONDS
    with_heartbeat ray-operator env GOBIN="$KUBERAY_DIR/gobin.tmp" GOFLAGS= "$GO" install -trimpath \
      -ldflags "-s -w" "$module@$KUBERAY_VERSION"
    mv -f "$KUBERAY_DIR/gobin.tmp/ray-operator" "$out"
    rmdir "$KUBERAY_DIR/gobin.tmp"
    record_time ray-operator "$KUBERAY_VERSION" $((SECONDS - start))
    log "built ray-operator in $((SECONDS - start))s -> $out"
  fi
  local rdir; rdir="$(module_dir "$module@$KUBERAY_VERSION")"
  rm -rf "$KUBERAY_DIR/config.tmp" && mkdir -p "$KUBERAY_DIR/config.tmp"
  cp -r "$rdir/config/crd" "$rdir/config/rbac" "$rdir/config/manager" "$rdir/config/default" \
    "$KUBERAY_DIR/config.tmp/"
  chmod -R u+w "$KUBERAY_DIR/config.tmp"   # the module cache is read-only; our copy need not be
  rm -rf "$KUBERAY_DIR/config" && mv "$KUBERAY_DIR/config.tmp" "$KUBERAY_DIR/config"
  link_into_cache_bin "$out"
}

# ------------------------------------------------------------------------------------------- coredns
# CoreDNS is built the way its docs describe custom builds (plugin.cfg): the real coremain with a chosen
# plugin set. Ours is the set a kubeadm cluster's Corefile uses, minus `forward` (this machine has no
# upstream resolver to forward to); leaving out the cloud DNS plugins saves most of the build.
COREDNS_PLUGINS=(errors health ready kubernetes prometheus cache loop reload loadbalance log hosts)
build_coredns() {
  local out="$COREDNS_DIR/bin/coredns"
  if [[ -x "$out" ]]; then log "coredns $COREDNS_VERSION: cached at $out"; link_into_cache_bin "$out"; return 0; fi
  local src="$COREDNS_DIR/src"
  if [[ ! -f "$src/go.sum" ]]; then
    log "preparing Go wrapper module for github.com/coredns/coredns $COREDNS_VERSION"
    rm -rf "$src.tmp" && mkdir -p "$src.tmp"
    local cdir; cdir="$(module_dir "github.com/coredns/coredns@$COREDNS_VERSION")"
    {
      echo "// Generated by trainop tests/controlplane/build.sh; throwaway, safe to delete."
      echo "module trainop.local/controlplane/coredns"
      echo
      grep -E '^go [0-9]' "$cdir/go.mod"
      echo
      echo "require github.com/coredns/coredns $COREDNS_VERSION"
    } >"$src.tmp/go.mod"
    {
      echo "// Generated by trainop tests/controlplane/build.sh: CoreDNS with the plugins of a kubeadm Corefile."
      echo "package main"
      echo
      echo "import ("
      echo '	_ "github.com/coredns/coredns/core/dnsserver"'
      local p
      for p in "${COREDNS_PLUGINS[@]}"; do
        case "$p" in
          prometheus) echo '	_ "github.com/coredns/coredns/plugin/metrics"' ;;
          *) echo "	_ \"github.com/coredns/coredns/plugin/$p\"" ;;
        esac
      done
      echo '	"github.com/coredns/coredns/coremain"'
      echo ")"
      echo
      echo "func main() { coremain.Run() }"
    } >"$src.tmp/main.go"
    (cd "$src.tmp" && "$GO" mod tidy)
    rm -rf "$src" && mv "$src.tmp" "$src"
  fi
  log "building coredns $COREDNS_VERSION (plugins: ${COREDNS_PLUGINS[*]})"
  mkdir -p "$COREDNS_DIR/bin"
  local start=$SECONDS
  (cd "$src" && with_heartbeat coredns "$GO" build -trimpath \
      -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$out.tmp" .)
  mv -f "$out.tmp" "$out"
  record_time coredns "$COREDNS_VERSION" $((SECONDS - start))
  log "built coredns in $((SECONDS - start))s -> $out"
  link_into_cache_bin "$out"
}

# ----------------------------------------------------------------------------------------- promtool
# The monitoring tier's `promtool check rules` / `promtool test rules`. Built here rather than taken from
# a distribution package so that `make test` alone provides it, at a pinned version. Prometheus' Go
# module is versioned v0.<major*100+minor>.<patch> (v0.316.0 is Prometheus 3.16.0) and has no replace
# directives, so plain `go install` works, as for helm.
build_promtool() {
  local out="$PROMTOOL_DIR/bin/promtool"
  if [[ -x "$out" ]]; then log "promtool $PROMETHEUS_VERSION: cached at $out"; link_into_cache_bin "$out"; return 0; fi
  log "building promtool $PROMETHEUS_VERSION (github.com/prometheus/prometheus/cmd/promtool)"
  mkdir -p "$PROMTOOL_DIR/bin" "$PROMTOOL_DIR/gobin.tmp"
  local start=$SECONDS
  with_heartbeat promtool env GOBIN="$PROMTOOL_DIR/gobin.tmp" GOFLAGS= "$GO" install -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
  mv -f "$PROMTOOL_DIR/gobin.tmp/promtool" "$out"
  rmdir "$PROMTOOL_DIR/gobin.tmp"
  record_time promtool "$PROMETHEUS_VERSION" $((SECONDS - start))
  log "built promtool in $((SECONDS - start))s -> $out"
  link_into_cache_bin "$out"
}

# ---------------------------------------------------------------------------------------- versitygw
# The S3 server of the object-storage tests (checkpoints and data on s3://, tests/objectstore): Versity's
# S3 gateway serving a plain directory (`versitygw ... posix DIR`). A real S3 implementation (SigV4,
# multipart uploads, ListObjectsV2, CopyObject), not a mock. MinIO has no semver tags on the Go proxy;
# versitygw's go.mod has no replace directives, so plain `go install` works, as for helm.
build_versitygw() {
  local out="$VERSITYGW_DIR/bin/versitygw"
  if [[ -x "$out" ]]; then log "versitygw $VERSITYGW_VERSION: cached at $out"; link_into_cache_bin "$out"; return 0; fi
  log "building versitygw $VERSITYGW_VERSION (github.com/versity/versitygw/cmd/versitygw)"
  mkdir -p "$VERSITYGW_DIR/bin" "$VERSITYGW_DIR/gobin.tmp"
  local start=$SECONDS
  with_heartbeat versitygw env GOBIN="$VERSITYGW_DIR/gobin.tmp" GOFLAGS= "$GO" install -trimpath \
    -ldflags "-s -w -X main.Version=$VERSITYGW_VERSION" \
    "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
  mv -f "$VERSITYGW_DIR/gobin.tmp/versitygw" "$out"
  rmdir "$VERSITYGW_DIR/gobin.tmp"
  record_time versitygw "$VERSITYGW_VERSION" $((SECONDS - start))
  log "built versitygw in $((SECONDS - start))s -> $out"
  link_into_cache_bin "$out"
}

# --------------------------------------------------------------------------------------------- main
components=("$@")
if (( ${#components[@]} == 0 )) || [[ "${components[0]}" == all ]]; then
  components=(etcd kube-apiserver kube-controller-manager kubectl kuberay-crds helm
              kube-scheduler kube-proxy kuberay-operator coredns promtool versitygw)
elif [[ "${components[0]}" == controlplane ]]; then
  components=(etcd kube-apiserver kube-controller-manager kubectl kuberay-crds helm)
fi
mkdir -p "$CP_ROOT"
# One build at a time per cache (parallel pytest-xdist workers, a second terminal): the others wait here
# and then find the binaries cached.
exec 9>"$CP_ROOT/.build.lock"
if ! flock -n 9; then
  log "another build holds $CP_ROOT/.build.lock; waiting for it"
  flock 9
fi
log "cache: $CP_ROOT; go: $("$GO" version)"
total_start=$SECONDS
for c in "${components[@]}"; do
  case "$c" in
    kube-apiserver|kube-controller-manager|kubectl|kube-scheduler|kube-proxy) build_k8s_binary "$c" ;;
    etcd) build_etcd ;;
    helm) build_helm ;;
    kuberay-crds) fetch_kuberay_crds ;;
    kuberay-operator) build_kuberay_operator ;;
    coredns) build_coredns ;;
    promtool) build_promtool ;;
    versitygw) build_versitygw ;;
    *) echo "build.sh: unknown component '$c'" >&2; exit 2 ;;
  esac
done
log "done in $((SECONDS - total_start))s; binaries also linked in $CACHE/bin"
