"""``buildctl.steps``: plain functions holding every decision; the CLI and the flows call them.

Each step takes a :class:`~buildctl.steps.context.Context` (settings, store, authority), made once
per command or flow run. Floors, bottom to top (import-linter keeps them):

* :mod:`.context`;
* :mod:`.pipeline` (plan, build, validate, publish), :mod:`.fleet` (node records, gc policy),
  :mod:`.node_index`, :mod:`.validate_process`, :mod:`.coverage`;
* :mod:`.healing`, :mod:`.node_agent` (pull and stage on a node), :mod:`.rollouts`,
  :mod:`.upgrade`, :mod:`.worker_queues`.
"""
