"""Every CLI command, walked with the names and places an operator gets wrong (#48 item 12): a
store that does not exist, an unknown profile and channel, a read-only destination and a malformed
``--endpoint-url``. Each ends with a documented exit code other than 1 and, when it fails, one
line on stderr and no traceback. The commands come from the typer app itself, so a new command
is walked without editing this file (its arguments are filled by their names below)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest
import typer.main

from buildctl.cli.main import EXIT_CODES, app

from ..support.helpers import PROFILES, REPO

pytestmark = pytest.mark.slow

# Commands that do minutes of real work when the store is merely missing (a build creates its
# store, as it should) or the destination is read-only (a build writes under its work dir, not
# there): walked with the unknown profile and the malformed endpoint, which fail first.
LONG = {("build",)}
LONG_SCENARIOS = {"unknown profile and channel", "malformed endpoint"}


def commands() -> list[tuple[list[str], list[tuple[str, str]]]]:
    """Every leaf command's path and its required parameters: (option or argument name, kind)."""
    out = []

    def walk(cmd, path):
        if hasattr(cmd, "list_commands"):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), path + [name])
        else:
            out.append((path, [(p.opts[0] if p.param_type_name == "option" else p.name, p.param_type_name)
                               for p in cmd.params if p.required]))

    walk(typer.main.get_command(app), [])
    return out


def fill(path: list[str], required: list[tuple[str, str]], v: dict[str, str]) -> list[str]:
    """The command line with each required parameter filled from ``v`` by its name."""
    by_name = {"profile": v["profile"], "--profile": v["profile"], "--channel": v["channel"], "--dest": v["dest"],
               "dest": v["dest"], "--out": v["out"], "artifact": v["artifact"], "engine": v["dest"],
               "directory": v["tree"], "--reason": "walk", "--from": v["dest"], "files": v["profile_file"],
               "file": v["profile_file"], "--traffic": v["traffic"], "--node-id": "walk-node", "key_id": "0" * 16,
               "--pool": "walk-pool", "--to": v["target"], "--node": "walk-node", "--model": v["model"]}
    args = list(path)
    for name, kind in required:
        value = by_name[name]
        if path == ["build"] and name == "profile":
            value = v["profile_file_or_name"]
        args += [value] if kind == "argument" else [name, value]
    return args


def scenarios(tmp: Path, ro: Path | None) -> dict[str, tuple[list[str], dict[str, str], dict[str, str]]]:
    tree = tmp / "tree"
    tree.mkdir(exist_ok=True)
    (tree / "config.json").write_text("{}")
    target = tmp / "target.yaml"
    target.write_text('driver_version: "580.65.06"\n')
    traffic = tmp / "traffic.yaml"
    traffic.write_text("{}\n")
    base = {"profile": "tiny-llama-cpu", "model": "tiny-llama", "channel": "prod", "dest": str(tmp / "dest"), "out": str(tmp / "out"),
            "artifact": "xxh3-128:" + "d" * 32, "tree": str(tree), "profile_file": str(PROFILES / "tiny-llama-cpu.yaml"),
            "profile_file_or_name": str(PROFILES / "tiny-llama-cpu.yaml"), "target": str(target),
            "traffic": str(traffic)}
    env = {"BUILDCTL_PROFILE_DIR": str(PROFILES)}
    out = {
        "missing store": (["--store", f"file://{tmp / 'missing'}"], base, env),
        "unknown profile and channel": (["--store", f"file://{tmp / 'store'}"],
                                        {**base, "profile": "tiny-lama-cpu", "model": "tiny-lama", "channel": "prdo",
                                         "profile_file_or_name": "tiny-lama-cpu"}, env),
        "malformed endpoint": (["--store", "s3://bucket-walk/p", "--endpoint-url", "notaurl"], base,
                               {**env, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}),
    }
    if ro is not None:
        out["read-only destination"] = (["--store", f"file://{tmp / 'store'}"],
                                        {**base, "dest": str(ro / "dest"), "out": str(ro / "out")}, env)
    return out


def test_every_command_with_wrong_names_and_places_says_which_with_a_documented_code(tmp_path, read_only_dir,
                                                                                     record_fault):
    read_only = read_only_dir  # None where no read-only filesystem can be mounted: that situation is left out
    from ..support.helpers import make_tree, publish_files, staged, write_attestation  # noqa: F401
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.steps.build import manifest_draft

    store = open_store(f"file://{tmp_path / 'store'}")
    draft = manifest_draft(load_profile(PROFILES / "tiny-llama-cpu.yaml"), detect())
    staged(store, publish_files(store, tmp_path / "published", draft, {"config.json": b"{}"}, seed=1))
    documented = {code for _, code, _ in EXIT_CODES if code != 1} | {0}
    runs = []
    for name, (glob, values, env) in scenarios(tmp_path, read_only).items():
        for path, required in commands():
            if tuple(path) in LONG and name not in LONG_SCENARIOS:
                continue
            args = fill(path, required, values)
            runs.append((name, args, env))

    def run(item):
        name, args, env = item
        # each run its own missing store: a command that creates one (node report) must not hide it from the next
        glob = [g.replace("/missing", f"/missing-{abs(hash(tuple(args)))}")
                for g in scenarios(tmp_path, read_only)[name][0]]
        try:
            r = subprocess.run([sys.executable, "-m", "buildctl", *glob, *args], cwd=tmp_path, capture_output=True,
                               text=True, timeout=120, stdin=subprocess.DEVNULL,
                               env={**{k: v for k, v in os.environ.items() if k != "BUILDCTL_DEBUG"},
                                    "PREFECT_API_URL": "http://127.0.0.1:9/api", **env})
        except subprocess.TimeoutExpired:
            return name, args, None, "timed out"
        return name, args, r.returncode, r.stderr

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, runs))
    bad = []
    for name, args, code, err in results:
        lines = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
        if code is None:
            bad.append(f"{name}: {' '.join(args)}: timed out")
        elif code == 1 or code not in documented:
            bad.append(f"{name}: {' '.join(args)}: exit {code}: {lines[-1:] if lines else ''}")
        elif "invalid settings" in (err or ""):
            bad.append(f"{name}: {' '.join(args)}: the walk's own settings are wrong: {lines[-1:]}")
        elif "Traceback" in (err or ""):
            bad.append(f"{name}: {' '.join(args)}: traceback")
        elif code != 0 and not (lines and lines[-1].startswith(("error:", "Error:", "usage", "Usage", "interrupted"))
                                or any(ln.lstrip("│ ").startswith(("Missing", "Invalid", "No such")) for ln in lines)):
            bad.append(f"{name}: {' '.join(args)}: exit {code} without a one-line error: {lines[-3:]}")
    record_fault("CLI walk", f"{len(results)} runs: every command x {len(results) // len(commands())} scenarios",
                 len(results), outcome="ok" if not bad else f"{len(bad)} failed")
    assert not bad, "\n".join(bad)
