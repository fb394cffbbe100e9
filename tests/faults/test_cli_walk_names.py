"""The slow CLI walk fills every command's required parameters by name; a new required option
with no value there fails the walk only after forty minutes of CI (#59 shipped ``--model`` so).
This checks the table against the typer app in a fraction of a second."""

from __future__ import annotations

from .test_cli_walk import commands, fill, scenarios


def test_every_required_parameter_of_every_command_has_a_value_in_every_scenario(tmp_path):
    missing = []
    for name, (_, values, _) in scenarios(tmp_path, None).items():
        for path, required in commands():
            try:
                fill(path, required, values)
            except KeyError as e:
                missing.append(f"{name}: {' '.join(path)}: no value for {e}")
    assert not missing, "\n".join(missing)
