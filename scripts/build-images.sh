#!/usr/bin/env bash
# Builds the Dockerfile's `server` and `worker-cpu` images with buildah, on a
# machine with no container registry and no container daemon: the Debian
# base images the FROM lines name are made with debootstrap from Debian's
# archive when they are neither in local storage nor pullable.
#
#   scripts/build-images.sh                    # server and worker-cpu
#   scripts/build-images.sh worker-cpu         # one target
#
# Environment:
#   MUTWO_IMAGES_CACHE   cache folder (default ~/.cache/mutwo-images): the
#                        debootstrap tarball and the apt archive cache that
#                        the build's RUN steps mount, kept between runs
#   MUTWO_IMAGE_PREFIX   image names PREFIX-server, PREFIX-worker-cpu
#                        (default mutwo, as deploy/compose.yaml)
#   MUTWO_TAG            image tag (default latest, as deploy/compose.yaml)
#   JOBS                 compile jobs in the build stage (default 2)
#   DEBIAN_MIRROR        debootstrap's mirror (default http://deb.debian.org/debian)
#   MUTWO_DEBOOTSTRAP=1  make the base with debootstrap without trying a pull
#   BUILDAH_ISOLATION    RUN isolation (default chroot: works without user
#                        namespaces or a runtime; oci where runc works)
#
# Needs root (or a user with subuids), buildah, podman (for `podman import`)
# and debootstrap. The build stage downloads Debian packages, so Debian's
# archive (or the mirror) must be reachable. Prints each image's size.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(server worker-cpu)
cache=$(realpath -m "${MUTWO_IMAGES_CACHE:-$HOME/.cache/mutwo-images}")
prefix=${MUTWO_IMAGE_PREFIX:-mutwo}
tag=${MUTWO_TAG:-latest}
jobs=${JOBS:-2}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
suite=bookworm

for tool in buildah podman debootstrap; do
  command -v "$tool" >/dev/null || {
    echo "build-images: $tool missing (apt-get install buildah podman debootstrap)" >&2
    exit 1
  }
done
mkdir -p "$cache"

have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# One debootstrap --variant=minbase (the packages of Priority required plus
# apt, as Debian's official images are made) with the official images' apt
# sources (the suite, its updates and security), saved twice: as is
# (debian:bookworm) and with the official slim images' dpkg filter, which
# leaves out documentation, manual pages and translations, now and in the
# packages installed later (debian:bookworm-slim).
rootfs_tars() {
  local root="$cache/rootfs"
  [ -s "$cache/debian-$suite-full.tar" ] && [ -s "$cache/debian-$suite-slim.tar" ] && return 0
  case "$root" in
    /*/*) ;;
    *) echo "build-images: refusing rootfs path '$root'" >&2; exit 1 ;;
  esac
  # A finished debootstrap removes its /debootstrap folder.
  if [ ! -f "$root/etc/debian_version" ] || [ -d "$root/debootstrap" ]; then
    echo "build-images: debootstrap $suite from $mirror (a few minutes)" >&2
    rm -rf "$root"
    debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
      tail -20 "$cache/debootstrap.log" >&2
      exit 1
    }
  fi
  rm -f "$root/etc/apt/sources.list"
  printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" \
    "Suites: $suite $suite-updates" "Components: main" \
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" "" \
    "Types: deb" "URIs: http://deb.debian.org/debian-security" \
    "Suites: $suite-security" "Components: main" \
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
    >"$root/etc/apt/sources.list.d/debian.sources"
  rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* "$root/var/log/"*.log
  tar --numeric-owner -C "$root" -cf "$cache/debian-$suite-full.tar.tmp" .
  mv "$cache/debian-$suite-full.tar.tmp" "$cache/debian-$suite-full.tar"

  printf '%s\n' "path-exclude /usr/share/doc/*" \
    "path-include /usr/share/doc/*/copyright" "path-exclude /usr/share/man/*" \
    "path-exclude /usr/share/groff/*" "path-exclude /usr/share/info/*" \
    "path-exclude /usr/share/lintian/*" "path-exclude /usr/share/linda/*" \
    "path-exclude /usr/share/locale/*" \
    "path-include /usr/share/locale/locale.alias" \
    >"$root/etc/dpkg/dpkg.cfg.d/docker"
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$root/usr/share/man/"* "$root/usr/share/info/"* "$root/usr/share/lintian/"*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  tar --numeric-owner -C "$root" -cf "$cache/debian-$suite-slim.tar.tmp" .
  mv "$cache/debian-$suite-slim.tar.tmp" "$cache/debian-$suite-slim.tar"
  rm -rf "$root"
}

# The FROM lines' names (debian:bookworm, debian:bookworm-slim), resolved by
# buildah to docker.io/library/...; tagged under localhost/ too.
ensure_base() {
  local name=$1 flavour=$2 ref="docker.io/library/$1" tar
  have_image "$ref" && return 0
  if [ "${MUTWO_DEBOOTSTRAP:-0}" != 1 ] && timeout 120 buildah pull -q "$ref" >/dev/null 2>&1; then
    echo "build-images: pulled $ref" >&2
    return 0
  fi
  rootfs_tars
  tar="$cache/debian-$suite-$flavour.tar"
  podman import -q "$tar" "localhost/$name" >/dev/null
  buildah tag "localhost/$name" "$ref"
  echo "build-images: $ref imported from $tar" >&2
}
ensure_base "debian:$suite" full
ensure_base "debian:$suite-slim" slim

# Debian packages downloaded by the RUN steps stay in this folder (a bind
# mount, so never in a layer); seeded with the host's apt cache, hard links
# where it is on the same file system.
apt_cache="$cache/apt-archives"
if [ ! -d "$apt_cache" ]; then
  mkdir -p "$apt_cache/partial"
  for deb in /var/cache/apt/archives/*.deb; do
    [ -e "$deb" ] || continue
    ln "$deb" "$apt_cache/" 2>/dev/null || cp "$deb" "$apt_cache/"
  done
fi

# The build context: the checkout's files (tracked ones, and untracked ones
# git does not ignore), copied once, so that every target sees the same
# sources and the shared build stage compiles once, even if the checkout
# changes during the build.
context=.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  context="$cache/context"
  rm -rf "$context"
  mkdir -p "$context"
  git ls-files -z --cached --others --exclude-standard |
    tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$context" -xf -
fi

# Docker's image format: the OCI format has no HEALTHCHECK (buildah drops it).
for target in "${targets[@]}"; do
  image="$prefix-$target:$tag"
  echo "build-images: building $image (target $target, $jobs jobs)" >&2
  start=$(date +%s)
  buildah bud --layers --pull-never --format docker --isolation "$BUILDAH_ISOLATION" \
    --volume "$apt_cache:/var/cache/apt/archives" \
    --build-arg JOBS="$jobs" --target "$target" -t "$image" -f "$context/Dockerfile" "$context"
  echo "build-images: $image built in $(($(date +%s) - start)) s" >&2
done

echo "build-images: sizes (uncompressed, base included)" >&2
for target in "${targets[@]}"; do
  image="localhost/$prefix-$target:$tag"
  printf '%s\t%s\n' "$image" "$(buildah images --format '{{.Size}}' "$image" | head -1)"
done
