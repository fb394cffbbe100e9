"""``python -m buildctl``: the same CLI as the ``buildctl`` console script."""

from buildctl.cli.entry import main

main()
