"""``python -m buildctl.flows.serve``: serve the nine deployments from this process (no work pool needed).

The local alternative to ``prefect deploy --all`` + ``prefect worker start``: the deployments,
the event triggers (read from prefect.yaml) and the build limit are created on the
Prefect API in ``PREFECT_API_URL``, and this process runs their flow runs. Stopping it does not
remove the trigger: runs triggered meanwhile wait as Late until something serves them again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

from prefect.exceptions import TerminationSignal
from prefect.runner import Runner

from buildctl.flows.build_validate_publish import build_validate_publish
from buildctl.flows.gc_store import gc_store
from buildctl.flows.heal_artifact import heal_artifact
from buildctl.flows.on_driver_upgrade import on_driver_upgrade
from buildctl.flows.prepare_upgrade import prepare_upgrade
from buildctl.flows.reconcile_fleet import reconcile_fleet
from buildctl.flows.resign_channels import resign_channels
from buildctl.flows.rollout_channel import rollout_channel
from buildctl.flows.scrub_store import scrub_store
from buildctl.core.settings import load_settings
from buildctl.flows.setup import deployment_schedules, deployment_triggers, ensure_build_limit


#: On SIGTERM or Ctrl-C, Prefect pauses every served deployment's schedule through the API; with the
#: server gone its client retries for minutes. Past this, the process exits anyway, and says so.
SHUTDOWN_S = 8.0


def _exit_after(seconds: float) -> None:
    def give_up() -> None:
        sys.stderr.write(f"flows.serve: the schedules were not all paused within {seconds:g} s (is the Prefect "
                         "server reachable?); exiting: pause them with `prefect deployment pause` if needed\n")
        sys.stderr.flush()
        os._exit(0)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()


class _BoundedRunner(Runner):
    """Prefect's runner, whose graceful stop on SIGTERM takes at most :data:`SHUTDOWN_S`."""

    def handle_sigterm(self, *args: object, **kwargs: object) -> None:
        _exit_after(SHUTDOWN_S)
        super().handle_sigterm(*args, **kwargs)


def _on_sigint(signum: int, frame: object) -> None:
    _exit_after(SHUTDOWN_S)
    raise KeyboardInterrupt


def serve(*deployments) -> None:
    """``prefect.serve``, with a stop that ends within :data:`SHUTDOWN_S` of the signal."""
    runner = _BoundedRunner(pause_on_shutdown=True)
    for deployment in deployments:
        runner.add_deployment(deployment)
    print(f"serving {len(deployments)} deployments: " + ", ".join(d.name for d in deployments), flush=True)
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, TerminationSignal):
        pass


def main() -> int:
    ensure_build_limit(load_settings())
    serve(
        build_validate_publish.to_deployment(name="build-validate-publish"),
        reconcile_fleet.to_deployment(name="reconcile-fleet", cron="0 2 * * *"),
        on_driver_upgrade.to_deployment(name="on-driver-upgrade", triggers=deployment_triggers("on-driver-upgrade")),
        scrub_store.to_deployment(name="scrub-store", cron="30 3 * * *"),
        heal_artifact.to_deployment(name="heal-artifact", triggers=deployment_triggers("heal-artifact")),
        rollout_channel.to_deployment(name="rollout-channel", parameters={"channel": "prod"},
                                      schedules=deployment_schedules("rollout-channel"), triggers=deployment_triggers("rollout-channel")),
        resign_channels.to_deployment(name="resign-channels", cron="15 */6 * * *"),
        gc_store.to_deployment(name="gc-store", cron="0 4 * * 0"),
        prepare_upgrade.to_deployment(name="prepare-upgrade"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
