"""``buildctl.artifact_store.fleet``: the store's records about the fleet.

* :mod:`.inventory`: what each node reported, one record per node;
* :mod:`.waves`: rollout records, wave buckets, and which artifact a node gets (the steps that move a
  rollout on are in :mod:`buildctl.steps.rollouts`; the CLI's ``rollout`` group in
  :mod:`buildctl.cli.rollout`).
"""
