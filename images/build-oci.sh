#!/usr/bin/env bash
# images/build-oci.sh — build ferrolb's two images as OCI image layouts, without a container
# daemon: static musl binaries from cargo, assembled with umoci (docs/decisions/0012).
#
#   images/build-oci.sh [--out DIR] [--target TRIPLE] [--profile PROFILE] [--lab]
#
# Writes DIR/ferrolb-controller and DIR/ferrolb-speaker (default DIR: target/oci), each an OCI
# image layout tagged with the workspace version, holding one file (the binary, at /) and a
# config that runs it as user 65532. The same content as images/Dockerfile builds.
#
# --lab also writes DIR/ferrolb-echo, the lab-only image of the lab pods' echo server (e2e/echo:
# HTTP on TCP 8080, UDP echo on 8081, answering with --name, $POD_NAME or the hostname), built
# the same way and tagged with the same version. It is never published.
#
# Push one with skopeo (Debian package), for example:
#   skopeo copy oci:target/oci/ferrolb-controller:0.1.0 docker://ghcr.io/ferrolb/ferrolb-controller:0.1.0
#
# Environment
#   FERROLB_CACHE            cache root (default ~/.cache/ferrolb)
#   FERROLB_IMAGE_TARGET_DIR cargo target directory of the image build (default
#                            $FERROLB_CACHE/image-target: kept across clones, so CI rebuilds
#                            only what changed, and the workspace's own target/ stays untouched)
#   SOURCE_DATE_EPOCH        creation time written into the images (default: the last commit's)
#
# Needs: cargo with the musl target (added with rustup when missing), musl-gcc, umoci and jq (apt
# packages musl-tools, umoci and jq, installed when missing and running as root; e2e/install-deps
# installs them too).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$REPO_ROOT/target/oci
TARGET=x86_64-unknown-linux-musl
PROFILE=release
# The user the images run as: not root, and not a user any distribution ships (distroless'
# "nonroot" uses the same number).
IMAGE_USER=65532:65532
COMPONENTS=(ferrolb-controller ferrolb-speaker)
# --lab: the lab's own images, built the same way.
LAB_COMPONENTS=(ferrolb-echo)
LAB=0

while (($#)); do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --lab) LAB=1; shift ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if ((LAB)); then COMPONENTS+=("${LAB_COMPONENTS[@]}"); fi

log() { printf '[build-oci] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

FERROLB_CACHE=${FERROLB_CACHE:-$HOME/.cache/ferrolb}
# Run from a test (cargo sets CARGO_MANIFEST_DIR, CARGO_PKG_* ... for it), those variables would
# reach the build scripts here: ring's reruns when CARGO_MANIFEST_DIR changes, and every caller
# would rebuild the images' whole dependency tree for the previous one. Build the same everywhere.
for var in $(compgen -e); do
  case $var in
    CARGO_MANIFEST_* | CARGO_PKG_* | CARGO_CRATE_NAME | CARGO_BIN_* | CARGO_PRIMARY_PACKAGE | CARGO_TARGET_TMPDIR) unset "$var" ;;
  esac
done
export CARGO_TARGET_DIR=${FERROLB_IMAGE_TARGET_DIR:-$FERROLB_CACHE/image-target}

case $TARGET in
  x86_64-*) ARCH=amd64 ;;
  aarch64-*) ARCH=arm64 ;;
  *) die "unsupported target $TARGET (x86_64-unknown-linux-musl or aarch64-unknown-linux-musl)" ;;
esac
[[ $TARGET == *-musl ]] || die "$TARGET: the images need static musl binaries"

# ------------------------------------------------------------- tools -----
ensure_tools() {
  local missing=()
  command -v umoci >/dev/null || missing+=(umoci)
  command -v jq >/dev/null || missing+=(jq)
  if [[ $TARGET == x86_64-* ]] && ! command -v musl-gcc >/dev/null; then missing+=(musl-tools); fi
  if ((${#missing[@]})); then
    ((EUID == 0)) || die "missing ${missing[*]}: apt-get install ${missing[*]}"
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  fi
  command -v rustup >/dev/null || die "rustup not found: the images need Rust's $TARGET target (rustup target add $TARGET)"
  if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    log "rustup target add $TARGET"
    rustup target add "$TARGET"
  fi
}

# ------------------------------------------------------------- build -----
build() {
  log "cargo build --profile $PROFILE --target $TARGET (target dir $CARGO_TARGET_DIR)"
  local flags=(--locked --profile "$PROFILE" --target "$TARGET")
  local c
  for c in "${COMPONENTS[@]}"; do flags+=(-p "$c"); done
  # musl targets link statically by default (e2e/tests/chart.rs runs each binary in an empty
  # root to prove it); cc picks musl-gcc for ring's C code.
  (cd "$REPO_ROOT" && nice -n "${FERROLB_NICE:-10}" cargo build "${flags[@]}")
}

binary_dir() {
  # cargo puts the dev profile in debug/.
  local dir=$PROFILE
  [[ $PROFILE == dev || $PROFILE == test ]] && dir=debug
  echo "$CARGO_TARGET_DIR/$TARGET/$dir"
}

# ------------------------------------------------------------- image -----
version() {
  cargo metadata --locked --no-deps --format-version 1 --manifest-path "$REPO_ROOT/Cargo.toml" |
    jq -r '.packages[] | select(.name == "ferrolb-controller") | .version'
}

# image <component> <version> <created>: one layout, one layer holding the binary.
image() {
  local name=$1 version=$2 created=$3
  local layout=$OUT/$name bin
  bin="$(binary_dir)/$name"
  [[ -x $bin ]] || die "$bin was not built"
  rm -rf "$layout"
  umoci init --layout "$layout"
  umoci new --image "$layout:$version"
  # unpack, add the file, repack: umoci 0.4.7's `insert` writes a layer tar without its end
  # blocks (GNU tar refuses it); repack writes a complete one. Fixed mode and times, so the
  # layer depends on the binary alone.
  local bundle
  bundle=$(mktemp -d)
  local rootless=()
  ((EUID == 0)) || rootless=(--rootless)
  umoci unpack "${rootless[@]}" --image "$layout:$version" "$bundle/b" >/dev/null
  install -m 0755 "$bin" "$bundle/b/rootfs/$name"
  touch -d "@$SOURCE_DATE_EPOCH" "$bundle/b/rootfs/$name" "$bundle/b/rootfs"
  umoci repack "${rootless[@]}" --image "$layout:$version" --history.created "$created" \
    --history.created_by "images/build-oci.sh: /$name" "$bundle/b"
  rm -rf "$bundle"
  umoci config --image "$layout:$version" --created "$created" --history.created "$created" \
    --os linux --architecture "$ARCH" \
    --config.user "$IMAGE_USER" --config.workingdir / \
    --config.entrypoint "/$name" \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.source=https://github.com/ferrolb/ferrolb" \
    --config.label "org.opencontainers.image.licenses=Apache-2.0"
  umoci gc --layout "$layout"
  log "$layout:$version ($ARCH)"
}

main() {
  ensure_tools
  build
  if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
    SOURCE_DATE_EPOCH=$(git -C "$REPO_ROOT" log -1 --format=%ct 2>/dev/null || echo 0)
  fi
  local created version c
  created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
  version=$(version)
  mkdir -p "$OUT"
  for c in "${COMPONENTS[@]}"; do image "$c" "$version" "$created"; done
}

main
