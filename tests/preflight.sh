#!/usr/bin/env bash
# What `make test` needs on this machine besides Python: checked before anything is built, so a missing
# tool stops the run at once, named, with the one command that installs it (instead of a tier that
# quietly does not run). `make test` and .ci/run call it; it installs nothing itself.
#
#   Go >= 1.26       builds the control plane, helm, promtool, versitygw and KubeRay's CRDs (tests/controlplane/build.sh)
#   flock, unshare, nsenter   build.sh's lock; private mount namespaces (util-linux)
#   ip                 the cluster bed's network namespaces, bridge and veths (iproute2)
#   iptables           kube-proxy's Service rules in the bed's network namespace (iptables)
#   root               the cluster bed creates network namespaces and cgroups (tests/clusterbed, tests/nodeagent)
#
# Exit 0 when everything is there, 2 otherwise (every missing tool is listed, not only the first).
set -uo pipefail

GO_MIN_MINOR=26          # go.mod of k8s.io/kubernetes v1.37 and of Prometheus v0.316 say go 1.26
GO_INSTALL="curl -fsSL https://go.dev/dl/go1.26.8.linux-amd64.tar.gz | tar -C /usr/local -xz   (then /usr/local/go/bin/go is found)"
missing=0

need() {  # tool, install command
  echo "preflight (make test, .ci/run): missing $1; install it with: $2" >&2
  missing=1
}

go_bin=""
for candidate in "${GO:-}" "$(command -v go 2>/dev/null)" /usr/local/go/bin/go; do
  if [[ -n "$candidate" && -x "$candidate" ]]; then go_bin="$candidate"; break; fi
done
if [[ -z "$go_bin" ]]; then
  need "a Go toolchain (>= 1.$GO_MIN_MINOR; looked for \$GO, go on PATH, /usr/local/go/bin/go)" "$GO_INSTALL"
else
  version="$("$go_bin" env GOVERSION 2>/dev/null)"          # e.g. go1.26.8
  minor="${version#go1.}"; minor="${minor%%.*}"
  if ! [[ "$minor" =~ ^[0-9]+$ ]] || (( minor < GO_MIN_MINOR )); then
    need "Go >= 1.$GO_MIN_MINOR ($go_bin is ${version:-of unknown version})" "$GO_INSTALL"
  fi
fi
for tool in flock unshare nsenter; do
  command -v "$tool" >/dev/null 2>&1 || need "$tool (util-linux)" "apt-get install -y util-linux"
done
command -v ip >/dev/null 2>&1 || need "ip (iproute2)" "apt-get install -y iproute2"
for tool in iptables iptables-restore; do
  command -v "$tool" >/dev/null 2>&1 || need "$tool (kube-proxy's rules)" "apt-get install -y iptables conntrack"
done
[[ "$(id -u)" == 0 ]] || need "root (the cluster bed creates network namespaces and cgroups)" "run as root (sudo make test)"
exit $(( missing ? 2 : 0 ))
