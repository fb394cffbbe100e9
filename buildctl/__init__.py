"""buildctl: build, checksum, publish, validate, promote and pull inference engines.

This package holds the pipeline steps as plain functions and the typer CLI over them.
Importing it is cheap: the CLI and the heavy backends are imported only where used.
"""

__version__ = "0.1.0"
