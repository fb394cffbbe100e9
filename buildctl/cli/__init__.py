"""The ``buildctl`` command line (typer). :mod:`buildctl.cli.main` builds the app and registers the
command modules beside it; none of them imports ``main``, so there is no import loop, and none
imports Prefect: a node runs ``buildctl pull`` and ``buildctl node report`` without it."""
