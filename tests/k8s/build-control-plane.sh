#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy (Kubernetes
# 1.20.2) and the pod sandbox's `pause` binary from Debian 12's `kubernetes` source package, once per machine, into a cache outside the repository keyed by the
# package version; install etcd, kubectl and openssl from Debian when missing. Idempotent: when the
# binaries are cached it prints their directory and exits at once. Needs root (apt-get).
set -euo pipefail

PKG_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
CACHE="${KOMPAKTOR_K8S_CACHE:-$HOME/.cache/kompaktor/k8s}/$PKG_VERSION"
BIN="$CACHE/bin"

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy pause)
have_bins() { local b; for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done; }
# the real node's runtime and networking: containerd + runc, CNI plugins, iptables (kube-proxy),
# dnsmasq (the harness's cluster DNS)
NODE_PACKAGES=(containerd runc containernetworking-plugins iptables dnsmasq-base)
have_node_tools() {
  command -v containerd >/dev/null && command -v runc >/dev/null && [[ -x /usr/lib/cni/bridge ]] \
    && command -v iptables >/dev/null && command -v dnsmasq >/dev/null
}
have_tools() {
  command -v etcd >/dev/null && command -v kubectl >/dev/null && command -v openssl >/dev/null && have_node_tools
}

if have_bins && have_tools; then
  echo "$BIN"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_update() { [[ $apt_updated == 1 ]] || { apt-get update -qq; apt_updated=1; }; }

if ! have_tools; then
  apt_update
  command -v etcd >/dev/null || apt-get install -y -qq etcd-server >/dev/null
  command -v kubectl >/dev/null || apt-get install -y -qq kubernetes-client >/dev/null
  command -v openssl >/dev/null || apt-get install -y -qq openssl >/dev/null
  have_node_tools || apt-get install -y -qq "${NODE_PACKAGES[@]}" >/dev/null
fi

if have_bins; then
  echo "$BIN"
  exit 0
fi

echo "building ${BINARIES[*]} $PKG_VERSION (first run only, ~10 min)" >&2
# Source packages: the same Debian mirrors as the binary entries, as deb-src.
SRC_LIST=/etc/apt/sources.list.d/kompaktor-deb-src.sources
if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null; then
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$SRC_LIST"
  else
    grep -E '^deb .* bookworm main' /etc/apt/sources.list | head -n 1 | sed 's/^deb /deb-src /' \
      > /etc/apt/sources.list.d/kompaktor-deb-src.list
  fi
  apt_updated=0
fi
apt_update
apt-get install -y -qq golang-go gcc libc6-dev rsync jq dpkg-dev golang-github-modern-go-reflect2-dev \
  golang-github-json-iterator-go-dev >/dev/null

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kompaktor-k8s-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
apt-get source -qq "kubernetes=$PKG_VERSION" >/dev/null 2>&1 || apt-get source -qq kubernetes >/dev/null
cd kubernetes-*/
# Required fix: the vendored reflect2 / json-iterator crash under Go >= 1.18 (SIGSEGV on the
# first custom-resource create); Debian's packaged copies work.
for pkg in github.com/modern-go/reflect2 github.com/json-iterator/go; do
  rm -rf "vendor/$pkg"
  cp -r "/usr/share/gocode/src/$pkg" "vendor/$pkg"
done
mkdir -p .go/src/k8s.io
ln -s ../../.. .go/src/k8s.io/kubernetes
mkdir -p "$WORK/home"
GOPATH="$PWD/.go" CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor HOME="$WORK/home" \
  GOCACHE="${KOMPAKTOR_GO_CACHE:-$HOME/.cache/kompaktor/go-build}" \
  KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean \
  make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kube-proxy" >&2
# The pod sandbox's process: no pause image can be pulled, so the real-node tier builds one from this.
gcc -Os -static -o _output/bin/pause build/pause/linux/pause.c
mkdir -p "$BIN"
for b in "${BINARIES[@]}"; do install -m 0755 "_output/bin/$b" "$BIN/"; done
echo "$BIN"
