# syntax=docker/dockerfile:1
# The vLLM reference side of validation: vLLM's OpenAI image plus buildctl, as a Prefect worker.
# UNTESTED BUILD: no Docker engine was available where this was written. Replace the digest
# placeholder with the digest you verified.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.11.0@sha256:0000000000000000000000000000000000000000000000000000000000000000
FROM ${VLLM_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PREFECT_HOME=/home/buildctl/.prefect \
    BUILDCTL_REPO=/opt/buildctl

WORKDIR /opt/buildctl
COPY pyproject.toml README.md prefect.yaml ./
COPY buildctl ./buildctl
COPY build_profiles ./build_profiles
# vllm and torch come from the base image.
RUN python3 -m pip install --no-deps . \
 && python3 -m pip install "pydantic>=2.7,<3" "pydantic-settings>=2.3" "cryptography>=42" "PyYAML>=6" "xxhash>=3.4" "boto3[crt]>=1.36" "typer>=0.12" "rich>=13" \
        "prefect>=3.4,<4" "nvidia-ml-py>=12" \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin buildctl

USER 10001
# A one-shot step, not a worker: `docker run IMAGE validate ARTIFACT --profile P` with the
# validator role's credentials and key, e.g. from CI before `buildctl promote` (docs/deployment.md).
# No deployment targets a validator pool: a build-validate-publish run validates on its own worker.
HEALTHCHECK NONE
ENTRYPOINT ["buildctl"]
CMD ["validate", "--help"]
