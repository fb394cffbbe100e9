"""``python -m buildctl.flows.serve``: serve the nine deployments from this process (no work pool needed).

The local alternative to ``prefect deploy --all`` + ``prefect worker start``: the deployments,
the event triggers (read from prefect.yaml) and the build limit are created on the
Prefect API in ``PREFECT_API_URL``, and this process runs their flow runs. Stopping it does not
remove the trigger: runs triggered meanwhile wait as Late until something serves them again.
"""

from __future__ import annotations

import sys

from prefect import serve

from buildctl.flows.build_validate_publish import build_validate_publish
from buildctl.flows.gc_store import gc_store
from buildctl.flows.heal_artifact import heal_artifact
from buildctl.flows.on_driver_upgrade import on_driver_upgrade
from buildctl.flows.prepare_upgrade import prepare_upgrade
from buildctl.flows.reconcile_fleet import reconcile_fleet
from buildctl.flows.resign_channels import resign_channels
from buildctl.flows.rollout_channel import rollout_channel
from buildctl.flows.scrub_store import scrub_store
from buildctl.settings import load_settings
from buildctl.flows.setup import deployment_triggers, ensure_build_limit


def main() -> int:
    ensure_build_limit(load_settings())
    serve(
        build_validate_publish.to_deployment(name="build-validate-publish"),
        reconcile_fleet.to_deployment(name="reconcile-fleet", cron="0 2 * * *"),
        on_driver_upgrade.to_deployment(name="on-driver-upgrade", triggers=deployment_triggers("on-driver-upgrade")),
        scrub_store.to_deployment(name="scrub-store", cron="30 3 * * *"),
        heal_artifact.to_deployment(name="heal-artifact", triggers=deployment_triggers("heal-artifact")),
        rollout_channel.to_deployment(name="rollout-channel", cron="*/5 * * * *", parameters={"channel": "prod"},
                                      triggers=deployment_triggers("rollout-channel")),
        resign_channels.to_deployment(name="resign-channels", cron="15 */6 * * *"),
        gc_store.to_deployment(name="gc-store", cron="0 4 * * 0"),
        prepare_upgrade.to_deployment(name="prepare-upgrade"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
