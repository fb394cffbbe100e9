"""``buildctl.core``: the ground floor, importing nothing else of buildctl.

:mod:`.errors` (every deliberate error and its exit code), :mod:`.settings`, :mod:`.times`,
:mod:`.digest` (xxh3-128 and BLAKE3 over files and streams), :mod:`.stats`, :mod:`.logtail`,
:mod:`.records` (the frozen pydantic base of every record).
"""
