"""``buildctl.steps``: plain functions holding every decision; the CLI and the flows call them.

Each step takes a :class:`~buildctl.steps.context.Context` (settings, store, authority), made once
per command or flow run. Floors, bottom to top (import-linter keeps them):

* :mod:`.context`;
* :mod:`.profiles`, :mod:`.node_index`, :mod:`.coverage`;
* :mod:`.fleet` (node records, gc policy);
* :mod:`.build` (plan, build, publish), :mod:`.validate`, :mod:`.promote`, :mod:`.host` (this host's
  side of a pull: compat keys, channel target, preflight, a refused pull's record);
* :mod:`.validate_process` (a validation in a child process);
* :mod:`.healing`, :mod:`.node_agent` (pull and stage on a node), :mod:`.rollouts`,
  :mod:`.upgrade`, :mod:`.worker_queues`.
"""
