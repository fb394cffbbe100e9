#!/usr/bin/env bash
# `make images`: build every image this machine can build, from requirements.lock.
#
#   scripts/images.sh [cpu|validator|builder-python ...]     (default: all three)
#
# Environment:
#   BASE_IMAGE   the Debian bookworm base (default python:3.11-slim-bookworm). When it is neither
#                present nor pullable (no registry), a local base is made once with debootstrap
#                from this host's apt archive: local/debian-bookworm:minbase.
#   CA_BUNDLE    a CA bundle for a TLS-intercepting proxy, passed to pip inside the build
#                (default: none; docs/deployment.md says when you need it).
#   IMAGE_TAG    the tag of the images (default: dev).
# The `+cpu` torch wheel comes from pip's find-links (PIP_FIND_LINKS) when it is there, else
# from download.pytorch.org. Docker builds with the legacy builder (DOCKER_BUILDKIT=0): no buildx.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
TAG=${IMAGE_TAG:-dev}
BASE=${BASE_IMAGE:-python:3.11-slim-bookworm}
LOCAL_BASE=local/debian-bookworm:minbase
NOT_INSTALLED=${NOT_INSTALLED:-torchvision torchaudio torchcodec triton}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(cpu validator builder-python)
export DOCKER_BUILDKIT=0
t0=$(date +%s)
say() { echo "images: $*" >&2; }

# --- a Docker engine ------------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
    say "starting dockerd (log: /tmp/dockerd.log)"
    nohup dockerd >/tmp/dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  fi
  docker info >/dev/null 2>&1 || { echo "error: no Docker engine (docker info fails, and dockerd cannot be started here)" >&2; exit 2; }
fi

# --- the base ---------------------------------------------------------------------------------------
apt_mirror() {  # this host's Debian archive, from apt's own sources
  local u
  u=$(grep -h -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
  [ -n "$u" ] || u=$(grep -h -E '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
  echo "${u:-http://deb.debian.org/debian}"
}
if ! docker image inspect "$BASE" >/dev/null 2>&1 && ! docker pull -q "$BASE" >/dev/null 2>&1; then
  say "$BASE cannot be pulled: using $LOCAL_BASE"
  if ! docker image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
    if ! command -v debootstrap >/dev/null; then
      [ "$(id -u)" = 0 ] || { echo "error: $BASE cannot be pulled and debootstrap is not installed (apt-get install debootstrap)" >&2; exit 2; }
      apt-get install -y -qq debootstrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null)
    fi
    root=$(mktemp -d /tmp/buildctl-base.XXXXXX)
    mirror=$(apt_mirror)
    say "debootstrap --variant=minbase bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >/tmp/buildctl-debootstrap.log 2>&1 \
      || { echo "error: debootstrap failed: see /tmp/buildctl-debootstrap.log" >&2; exit 2; }
    # the archive the host uses, inside the image too (apt-get in the Dockerfiles)
    echo "deb $mirror bookworm main" > "$root/etc/apt/sources.list"
    tar -C "$root" -c . | docker import - "$LOCAL_BASE" >/dev/null
    rm -rf "$root"
  fi
  BASE=$LOCAL_BASE
fi

# --- the build context's extras: CA bundle and local wheels ------------------------------------------
ctx=docker/context
rm -rf "$ctx" && mkdir -p "$ctx/wheels"
: > "$ctx/ca.pem"
CA_BUNDLE=${CA_BUNDLE-${PIP_CERT:-}}  # by default the bundle this host's pip trusts
if [ -n "${CA_BUNDLE:-}" ]; then
  [ -s "$CA_BUNDLE" ] || { echo "error: CA_BUNDLE=$CA_BUNDLE is not a readable, non-empty file" >&2; exit 2; }
  cp "$CA_BUNDLE" "$ctx/ca.pem"
fi
torch_index=https://download.pytorch.org/whl/cpu
for pin in $(grep -E '^[A-Za-z0-9_.-]+==[^ ]*\+' requirements.lock | cut -d' ' -f1); do  # local versions: not on PyPI
  name=${pin%%==*}; version=${pin#*==}
  found=""
  for d in ${PIP_FIND_LINKS:-}; do
    f=$(ls "$d"/"${name//-/_}"-"$version"-*.whl 2>/dev/null | head -1 || true)
    [ -n "$f" ] && { found=$f; break; }
  done
  if [ -n "$found" ]; then
    cp "$found" "$ctx/wheels/"
    [ "$name" = torch ] && torch_index=""
    say "$pin from $found"
  fi
done

build() {  # build NAME DOCKERFILE [ARGS...]
  local name=$1 file=$2; shift 2
  local s; s=$(date +%s)
  say "building buildctl-$name:$TAG ($file)"
  docker build -q -f "$file" -t "buildctl-$name:$TAG" "$@" . >/tmp/buildctl-image-$name.log 2>&1 \
    || { tail -30 /tmp/buildctl-image-$name.log >&2; echo "error: buildctl-$name failed: /tmp/buildctl-image-$name.log" >&2; exit 1; }
  say "buildctl-$name:$TAG built in $(( $(date +%s) - s )) s"
}

for target in "${TARGETS[@]}"; do
  case $target in
    cpu) build cpu docker/cpu.Dockerfile --build-arg BASE_IMAGE="$BASE" --build-arg TORCH_INDEX="$torch_index" \
           --build-arg NOT_INSTALLED="$NOT_INSTALLED" ;;
    validator) build validator docker/validator.Dockerfile --build-arg CPU_IMAGE="buildctl-cpu:$TAG" ;;
    builder-python)  # the GPU builder's Python layer on the CPU base: its import errors show here
      if command -v hadolint >/dev/null || [ -x .venv/bin/hadolint ]; then
        "$(command -v hadolint || echo .venv/bin/hadolint)" docker/builder.Dockerfile docker/cpu.Dockerfile docker/validator.Dockerfile
        say "hadolint: the Dockerfiles pass"
      fi
      build builder-python docker/builder.Dockerfile --build-arg TRTLLM_IMAGE="$BASE" ;;
    *) echo "error: unknown image $target (cpu, validator, builder-python)" >&2; exit 2 ;;
  esac
done
say "done in $(( $(date +%s) - t0 )) s: $(printf 'buildctl-%s:'"$TAG"' ' "${TARGETS[@]}")"
