#!/usr/bin/env bash
# Build Kompaktor's images — operator, compactor, the chart's bundled Redis — with whichever of
# docker, podman or buildah is here (CONTAINER_TOOL= overrides), from the repository's own
# Dockerfiles, offline: the package's wheel and every wheel it needs are made on the host first
# (a wheelhouse cached by pyproject.toml) and copied into the build context.
#
# Without a registry (buildah/podman, or KOMPAKTOR_BASE=debian) the base is a Debian bookworm
# root filesystem made with mmdebstrap, cached by its inputs; PYTHON_IMAGE / REDIS_BASE_IMAGE
# override the base. Each image is rebuilt only when its inputs change (Dockerfile, wheels,
# base, version): buildah/podman keep an OCI archive per input hash under
# ~/.cache/kompaktor/images and write images.json (image -> archive), which the test tier
# imports into a real node's containerd. With buildah it also builds the test node's pod
# sandbox image (localhost/kompaktor/pause:3.2) when the pause binary was built
# (tests/k8s/build-control-plane.sh).
#
# Prints the path of images.json on its last line.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
VERSION="$(sed -n 's/^__version__ *= *"\(.*\)"/\1/p' compactor/kompaktor/__init__.py | head -n 1)"
[[ -n "$VERSION" ]] || { echo "build-images: no __version__ in compactor/kompaktor/__init__.py" >&2; exit 1; }
REGISTRY="${REGISTRY:-ghcr.io/kompaktor}"
OPERATOR_IMAGE="${OPERATOR_IMAGE:-$REGISTRY/kompaktor-operator:$VERSION}"
COMPACTOR_IMAGE="${COMPACTOR_IMAGE:-$REGISTRY/kompaktor-compactor:$VERSION}"
REDIS_IMAGE="${REDIS_IMAGE:-$REGISTRY/kompaktor-redis:$VERSION}"
PAUSE_IMAGE="localhost/kompaktor/pause:3.2"
CACHE="${KOMPAKTOR_IMAGE_CACHE:-$HOME/.cache/kompaktor/images}"
WHEEL_CACHE="${KOMPAKTOR_WHEEL_CACHE:-$HOME/.cache/kompaktor/wheels}"
K8S_BIN="${KOMPAKTOR_K8S_CACHE:-$HOME/.cache/kompaktor/k8s}/1.20.5+really1.20.2-1.1+deb12u1/bin"
SUITE=bookworm
MIRROR="${KOMPAKTOR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES="python3,python3-venv,tini,ca-certificates"
if [[ "${1:-}" == --list ]]; then  # what would be built: NAME IMAGE DOCKERFILE
  echo "operator $OPERATOR_IMAGE operator/Dockerfile"
  echo "compactor $COMPACTOR_IMAGE compactor/Dockerfile"
  echo "redis $REDIS_IMAGE helm/redis/Dockerfile"
  exit 0
fi
mkdir -p "$CACHE" "$WHEEL_CACHE"
log() { echo "build-images: $*" >&2; }
sha() { sha256sum | cut -c1-16; }
# pip_wheel, wheelhouse, publish
source "$ROOT/scripts/build-images-lib.sh"

# --- the tool ---------------------------------------------------------------------------------
TOOL="${CONTAINER_TOOL:-}"
if [[ -z "$TOOL" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then TOOL=docker
  elif command -v podman >/dev/null; then TOOL=podman
  elif command -v buildah >/dev/null; then TOOL=buildah
  elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "no docker engine, podman or buildah: installing Debian's buildah"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null; }
    TOOL=buildah
  else
    echo "build-images: no container build tool: start a Docker engine, or install podman or buildah" >&2
    exit 1
  fi
fi
case "$TOOL" in
  docker)
    docker info >/dev/null 2>&1 || {
      echo "build-images: no Docker engine reachable ('docker info' failed): start Docker, set DOCKER_HOST, or use CONTAINER_TOOL=buildah" >&2
      exit 1; }
    build() { docker build "$@"; } ;;
  podman) build() { podman build "$@"; } ;;
  buildah) build() { buildah bud --isolation chroot "$@"; } ;;
  *) echo "build-images: CONTAINER_TOOL must be docker, podman or buildah (got '$TOOL')" >&2; exit 1 ;;
esac
log "building with $TOOL"

# --- the base ---------------------------------------------------------------------------------
# docker pulls the Dockerfiles' pinned python slim image; where no registry is reachable
# (buildah/podman here, or KOMPAKTOR_BASE=debian) the base is made with mmdebstrap.
BASE_ARGS=()
REDIS_ARGS=()
BASE_KEY="default"
if [[ -n "${PYTHON_IMAGE:-}" ]]; then
  BASE_ARGS=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
  BASE_KEY="$PYTHON_IMAGE"
elif [[ "${KOMPAKTOR_BASE:-}" == debian || ( "$TOOL" != docker && "${KOMPAKTOR_BASE:-}" != python ) ]]; then
  base_hash="$(printf '%s\n' "$SUITE" "$MIRROR" "$BASE_PACKAGES" minbase | sha)"
  BASE="localhost/kompaktor/debian-base:$SUITE-$base_hash"
  tarball="$CACHE/debian-base-$base_hash.tar"
  if [[ ! -s "$tarball" ]]; then
    command -v mmdebstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
    log "making the Debian $SUITE base with mmdebstrap ($BASE_PACKAGES)"
    # (mmdebstrap picks the output format from the name's extension: keep .tar last)
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$CACHE/partial-$base_hash.tar" \
      "$MIRROR" >&2
    mv "$CACHE/partial-$base_hash.tar" "$tarball"
  fi
  if ! $TOOL inspect --type image "$BASE" >/dev/null 2>&1 \
      && ! { [[ $TOOL == buildah ]] && buildah inspect --type image "$BASE" >/dev/null 2>&1; }; then
    ctx="$(mktemp -d)"
    ln "$tarball" "$ctx/rootfs.tar" 2>/dev/null || cp "$tarball" "$ctx/rootfs.tar"
    printf 'FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n' > "$ctx/Dockerfile"
    build -q -f "$ctx/Dockerfile" -t "$BASE" "$ctx" >/dev/null
    rm -rf "$ctx"
  fi
  BASE_ARGS=(--build-arg "PYTHON_IMAGE=$BASE")
  REDIS_ARGS=(--build-arg "BASE_IMAGE=$BASE")
  BASE_KEY="$BASE"
fi
[[ -n "${REDIS_BASE_IMAGE:-}" ]] && REDIS_ARGS=(--build-arg "BASE_IMAGE=$REDIS_BASE_IMAGE")

# --- the wheelhouse ---------------------------------------------------------------------------
PY="${PYTHON:-}"
[[ -n "$PY" ]] || { [[ -x "$ROOT/.venv/bin/python" ]] && PY="$ROOT/.venv/bin/python"; } || PY=python3
deps_hash="$(cat pyproject.toml | sha)"
DEPS="$WHEEL_CACHE/deps-$deps_hash"
wheelhouse "$DEPS"
# the package itself, from the working tree (its hash is part of every image's inputs)
PKG="$(mktemp -d)"
trap 'rm -rf "$PKG"' EXIT
pip_wheel --no-deps --wheel-dir "$PKG" .
ls "$PKG"/kompaktor-*.whl >/dev/null
pkg_hash="$(cd "$PKG" && unzip -p kompaktor-*.whl | sha)"

# --- one image --------------------------------------------------------------------------------
MANIFEST="$CACHE/images.json"
declare -A ARCHIVES=()

one() {  # NAME IMAGE DOCKERFILE WITH_WHEELS [build args...]
  local name="$1" image="$2" dockerfile="$3" wheels="$4"
  shift 4
  local key
  key="$( { cat "$dockerfile"; echo "$VERSION $BASE_KEY $*"; if [[ $wheels == yes ]]; then echo "$pkg_hash"; ls "$DEPS"; fi; } | sha)"
  local archive="$CACHE/$name-$key.tar"
  if [[ $TOOL != docker && -s "$archive" ]]; then
    log "$image: up to date ($archive)"
    ARCHIVES[$image]="$archive"
    return
  fi
  local ctx
  ctx="$(mktemp -d)"
  if [[ $wheels == yes ]]; then
    mkdir "$ctx/wheels"
    cp -l "$DEPS"/*.whl "$ctx/wheels/" 2>/dev/null || cp "$DEPS"/*.whl "$ctx/wheels/"
    cp "$PKG"/kompaktor-*.whl "$ctx/wheels/"
  fi
  cp "$dockerfile" "$ctx/Dockerfile"
  log "$image: building"
  local t0=$SECONDS
  build -q -f "$ctx/Dockerfile" --build-arg "VERSION=$VERSION" "$@" -t "$image" "$ctx" >/dev/null
  rm -rf "$ctx"
  if [[ $TOOL != docker ]]; then
    publish "$name" "$image" "$archive"
    ARCHIVES[$image]="$archive"
  fi
  log "$image: built in $((SECONDS - t0)) s"
}

one operator "$OPERATOR_IMAGE" operator/Dockerfile yes "${BASE_ARGS[@]}"
one compactor "$COMPACTOR_IMAGE" compactor/Dockerfile yes "${BASE_ARGS[@]}"
one redis "$REDIS_IMAGE" helm/redis/Dockerfile no "${REDIS_ARGS[@]}"
if [[ $TOOL != docker && -x "$K8S_BIN/pause" ]]; then
  pctx="$(mktemp -d)"
  cp "$K8S_BIN/pause" "$pctx/pause"
  printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' > "$pctx/Dockerfile.pause"
  pkey="$( { sha256sum "$pctx/pause"; cat "$pctx/Dockerfile.pause"; } | sha)"
  if [[ ! -s "$CACHE/pause-$pkey.tar" ]]; then
    build -q -f "$pctx/Dockerfile.pause" -t "$PAUSE_IMAGE" "$pctx" >/dev/null
    publish pause "$PAUSE_IMAGE" "$CACHE/pause-$pkey.tar"
  fi
  ARCHIVES[$PAUSE_IMAGE]="$CACHE/pause-$pkey.tar"
  rm -rf "$pctx"
fi

if [[ $TOOL != docker ]]; then
  {
    echo "{"
    sep=""
    for image in "${!ARCHIVES[@]}"; do
      printf '%s  "%s": "%s"' "$sep" "$image" "${ARCHIVES[$image]}"
      sep=$',\n'
    done
    printf '\n}\n'
  } > "$MANIFEST.tmp"
  mv "$MANIFEST.tmp" "$MANIFEST"
  echo "$MANIFEST"
fi
