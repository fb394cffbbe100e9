# syntax=docker/dockerfile:1
# The TensorRT-LLM build worker: NVIDIA's TensorRT-LLM release image at the version the
# `trtllm` extra pins (tensorrt-llm==1.2.1, the last line that ships trtllm-build), plus buildctl.
# UNTESTED BUILD: no Docker engine was available where this was written. Replace the digest
# placeholder with the digest you verified (docker buildx imagetools inspect <image>).
ARG TRTLLM_IMAGE=nvcr.io/nvidia/tensorrt-llm/release:1.2.1@sha256:0000000000000000000000000000000000000000000000000000000000000000
FROM ${TRTLLM_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PREFECT_HOME=/home/buildctl/.prefect \
    BUILDCTL_TRTLLM_VERSION=1.2.1 \
    BUILDCTL_TRTLLM_EXAMPLES=/app/tensorrt_llm/examples \
    BUILDCTL_REPO=/opt/buildctl

WORKDIR /opt/buildctl
COPY pyproject.toml README.md prefect.yaml ./
COPY buildctl ./buildctl
COPY build_profiles ./build_profiles
# tensorrt-llm comes from the base image; install buildctl without touching it.
RUN python3 -m pip install --no-deps . \
 && python3 -m pip install "pydantic>=2.7,<3" "pydantic-settings>=2.3" "cryptography>=42" "PyYAML>=6" "xxhash>=3.4" "boto3[crt]>=1.36" "typer>=0.12" "rich>=13" \
        "prefect>=3.4,<4" "nvidia-ml-py>=12" \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin buildctl

USER 10001
# The worker's health endpoint (--with-healthcheck) on PREFECT_WORKER_WEBSERVER_PORT (8080).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]
# buildctl worker start creates this host's compat-key queues, then execs Prefect's worker on them
# only (--builds-only: a GPU host does not run the control flows). The pool is prefect.yaml's.
ENTRYPOINT ["buildctl", "worker", "start", "--healthcheck"]
CMD ["--pool", "buildctl-local", "--builds-only"]
