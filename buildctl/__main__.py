"""``python -m buildctl``: the same CLI as the ``buildctl`` console script."""

from buildctl.cli.main import main

main()
