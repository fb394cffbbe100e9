# syntax=docker/dockerfile:1
# The TensorRT-LLM build worker: NVIDIA's TensorRT-LLM release image at the version the `trtllm`
# extra pins (tensorrt-llm==1.2.1, the last line that ships trtllm-build; torch and CUDA come from
# it), plus buildctl and exactly the pins of docker/builder.lock (`make lock`: buildctl's own
# dependencies with the orchestration and kubernetes extras, resolved for every Python the base
# may have, constrained to requirements.lock's versions).
#
# Pin the base by digest in production (docker buildx imagetools inspect <image>). This image
# cannot be built on a machine without NGC access; `make images` lints this file (hadolint) and
# builds it on the local Debian base as `buildctl-builder-python`, so that a module the worker
# imports and the lock lacks fails there (docs/deployment.md).
ARG TRTLLM_IMAGE=nvcr.io/nvidia/tensorrt-llm/release:1.2.1
FROM ${TRTLLM_IMAGE}
USER 0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    HOME=/home/buildctl \
    PREFECT_HOME=/home/buildctl/.prefect \
    BUILDCTL_TRTLLM_VERSION=1.2.1 \
    BUILDCTL_TRTLLM_EXAMPLES=/app/tensorrt_llm/examples \
    BUILDCTL_REPO=/opt/buildctl
# A bare Debian base (the CPU check) has no pip; NVIDIA's image has it.
# hadolint ignore=DL3008
RUN if ! python3 -m pip --version >/dev/null 2>&1; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && (id buildctl >/dev/null 2>&1 || useradd --create-home --uid 10001 --shell /usr/sbin/nologin buildctl)
WORKDIR /opt/buildctl
COPY docker/context/ /ctx/
COPY docker/builder.lock ./
# tensorrt-llm and torch come from the base image: the lock does not list them. Before buildctl's
# own source, so a code change rebuilds only the layers after it.
RUN set -e; if [ -s /ctx/ca.pem ]; then export PIP_CERT=/ctx/ca.pem; fi; \
    python3 -m pip install -q --no-deps -r builder.lock \
 && rm -rf /ctx
COPY pyproject.toml README.md prefect.yaml ./
COPY buildctl ./buildctl
COPY build_profiles ./build_profiles
COPY docker/entrypoint.sh /usr/local/bin/buildctl-entrypoint
RUN python3 -m pip install -q --no-deps --no-build-isolation -e /opt/buildctl
USER 10001
# The worker's health endpoint (--with-healthcheck) on PREFECT_WORKER_WEBSERVER_PORT (8080).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]
# `buildctl ARGS` by default (docker/entrypoint.sh); a Kubernetes Job's `prefect flow-run execute`
# runs as given. As a worker: `worker start` creates this host's compat-key queues, then execs
# Prefect's worker on them only (--builds-only: a GPU host does not run the control flows).
ENTRYPOINT ["buildctl-entrypoint"]
CMD ["worker", "start", "--healthcheck", "--pool", "buildctl-gpu", "--builds-only"]
