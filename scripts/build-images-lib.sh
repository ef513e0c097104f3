# The steps of scripts/build-images.sh that can fail half-way and leave something behind, as
# functions (sourced by the script, and by tests/unit/test_build_images_lib.py with stubs).
#
# They read PY (the Python whose pip makes wheels), TOOL (docker, podman or buildah) and CACHE
# (the archive directory), and log through log() when the script defines it.

# pip wheel -q ARGS...: its "Location ... is ignored" warnings filtered out. Fails when pip fails
# (the filter's own status, 1 when nothing was left to print, is not pip's).
pip_wheel() {
  "$PY" -m pip wheel -q "$@" 2>&1 | { grep -v "^WARNING: Location .* is ignored" >&2 || true; }
  return "${PIPESTATUS[0]}"
}

# wheelhouse DIR: every wheel kompaktor[spark,operator] needs (not kompaktor's own), built once.
# DIR holds a whole wheelhouse or does not exist: the wheels are made in DIR.partial and moved to
# DIR only when pip succeeded, so a failed build caches nothing and the next run starts again.
wheelhouse() {
  local dir="$1" partial="$1.partial"
  [[ -f "$dir/.complete" ]] && return 0
  declare -F log >/dev/null && log "wheelhouse for kompaktor[spark,operator] (once per pyproject.toml)"
  rm -rf "$dir" "$partial"
  mkdir -p "$partial"
  # async-timeout: redis-py needs it below Python 3.11.3, and Debian bookworm's python3 is 3.11.2
  # while the host's may be newer (pip resolves markers for the Python that runs it)
  if ! pip_wheel --wheel-dir "$partial" ".[spark,operator]" "async-timeout>=4.0.3" \
    || ! ls "$partial"/pyspark-*.whl "$partial"/kopf-*.whl >/dev/null 2>&1; then
    rm -rf "$partial"
    echo "build-images: pip wheel failed (its error is above): no wheelhouse cached" >&2
    return 1
  fi
  rm -f "$partial"/kompaktor-*.whl
  touch "$partial/.complete"
  mv "$partial" "$dir"
}

# publish NAME IMAGE ARCHIVE: the image just built becomes NAME's only archive in CACHE, and the
# copy of IMAGE it replaced — left untagged in the tool's storage (/var/lib/containers) — is
# removed: a rebuild per change filled 35 GB here until the node's kubelet evicted the test's pods.
publish() {
  local name="$1" image="$2" archive="$3"
  rm -f "$CACHE/$name"-*.tar
  "$TOOL" push -q "$image" "oci-archive:$CACHE/partial-$name.tar:$image" >/dev/null
  mv "$CACHE/partial-$name.tar" "$archive"
  case "$TOOL" in
    buildah) buildah rmi --prune >/dev/null 2>&1 || true ;;
    podman) podman image prune -f >/dev/null 2>&1 || true ;;
  esac
}
