"""Crash consistency as a property (#48): a fault at every filesystem syscall of ``pull``, ``pull
--stage-only`` and ``node activate`` in turn leaves a node that serves a complete, verified engine,
with the documented exit code, and a re-run finishes the job.

strace injects the fault (``-e inject=SYSCALL:error=ENOSPC:when=N``, ``:signal=SIGINT``,
``:signal=SIGKILL``) into the Nth call of each syscall that touches the install directory in a
dry run of the same command (``-y`` names each descriptor's file): every rename, symlink, unlink,
mkdir, write and fsync. After each injection:

* ``current`` resolves to a complete engine whose files match its manifest, and ``current`` and
  ``previous`` are the state before the command, the state after it, or the one in between that
  the swap allows (``previous`` already moved to the old ``current``, ``current`` not yet);
* the exit code is the documented one: 12 for a full disk or an I/O error, 130 for SIGINT, 0 only
  when the command's work is complete; SIGKILL kills it;
* a re-run without a fault exits 0 with the state after the command, and no staging folder or
  temporary file is left behind.

The store is a local directory (the node side is what is under test); engines are engine-like
trees (no preflight: ``--skip-preflight``). The syscalls injected are listed in the report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from ..support.helpers import REPO
from buildctl.artifact_store.node.pull import PullOptions

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")]

PROFILE = "llama-3-8b-instruct-fp8-tp1"
SYSCALLS = ("rename", "renameat", "renameat2", "symlink", "symlinkat", "unlink", "unlinkat", "mkdir", "mkdirat",
            "write", "pwrite64", "fsync", "fdatasync")
FAULTS = ("error=ENOSPC", "signal=SIGINT", "signal=SIGKILL")
LINE = re.compile(r"^(?:\[pid\s+\d+\]\s+)?(\d+\s+)?(\w+)\((.*)$")


def _publish(store, tmp: Path, fp, seed: int) -> str:
    from buildctl.artifact_store.publish import ManifestDraft

    from ..support.helpers import publish_files, write_attestation

    draft = ManifestDraft(profile_name=PROFILE, profile_hash="xxh3-128:" + "0" * 32, backend="trtllm",
                          compat_key=fp.compat_key("trtllm"), fingerprint=fp.model_dump(mode="json"),
                          tool_versions={"backend": fp.tool_version("trtllm")}, model_digest=None, build_key=None)
    aid = publish_files(store, tmp / f"tree{seed}", draft, {"config.json": f'{{"seed": {seed}}}'.encode(),
                                                           "rank0.engine": 96 * 1024, "lora/a.bin": 2048},
                        seed=seed, verdict=None)
    write_attestation(store, aid, fp.compat_key("trtllm"), "pass", validator=fp)
    return aid


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A store and a node: P0 then A pulled (current A, previous P0); B newer on prod for this
    host; C on prod for the host after an upgrade, and a second node folder where C is staged."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.promotion import promote
    from buildctl.steps.context import Context
    from buildctl.steps import node_agent
    from buildctl.engines.fingerprint import UpgradeTarget

    from ..support.helpers import settings, staged
    from ..support.trtllm_kit import h100x8

    tmp = tmp_path_factory.mktemp("crash")
    before = h100x8()
    after = before.model_copy(update={"tensorrt_llm_version": "1.2.2", "tensorrt_version": "10.14.1.48"})
    store = open_store(f"file://{tmp / 'store'}")
    ctx = Context.from_settings(settings(), store=store)
    ids = {}
    dest = tmp / "node"
    for name, seed in (("p0", 1), ("a", 2)):
        ids[name] = _publish(store, tmp, before, seed)
        promote(store, staged(store, ids[name]), "prod")
        node_agent.pull(ctx.with_fingerprint(before), PROFILE, 'prod', dest, PullOptions(skip_preflight=True, health_check=False))
    ids["c"] = _publish(store, tmp, after, 4)
    promote(store, staged(store, ids["c"]), "prod")
    ids["b"] = _publish(store, tmp, before, 3)
    promote(store, staged(store, ids["b"]), "prod")
    staged_dest = tmp / "node-staged"
    shutil.copytree(dest, staged_dest, symlinks=True)
    target = UpgradeTarget(tensorrt_llm_version="1.2.2", tensorrt_version="10.14.1.48")
    node_agent.stage(ctx.with_fingerprint(before), PROFILE, 'prod', staged_dest, target)
    (tmp / "target.yaml").write_text('tensorrt_llm_version: "1.2.2"\ntensorrt_version: "10.14.1.48"\n')
    for name, fp in (("before", before), ("after", after)):
        (tmp / f"fp-{name}.json").write_text(json.dumps(fp.model_dump(mode="json")))
    return {"tmp": tmp, "store": store, "ids": ids, "dest": dest, "staged_dest": staged_dest}


def _link(dest: Path, name: str) -> str | None:
    try:
        return "xxh3-128:" + Path(os.readlink(dest / name)).name
    except OSError:
        return None


def _state(dest: Path) -> tuple[str | None, str | None]:
    return _link(dest, "current"), _link(dest, "previous")


def _complete(store, dest: Path, aid: str) -> list:
    from buildctl.artifact_store.node.install_dir import local_problems
    from buildctl.artifact_store.read import get_manifest

    return local_problems(get_manifest(store, aid), dest / "versions" / aid.split(":")[1])


def _leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.iterdir() if p.name.startswith(".staging-") or p.name.endswith(".tmp")
                  or re.match(r"^\.(current|previous)-", p.name))


def _strace(trace_out: Path, argv: list[str], env: dict, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["strace", "-f", "-qq", "-o", str(trace_out), *extra, sys.executable, "-m", "buildctl",
                           *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def _calls_touching(dest: Path, trace: str) -> dict[str, list[int]]:
    """For each syscall, the call numbers N whose Nth call in some thread names a path or a
    descriptor under ``dest`` (strace counts ``when=N`` per thread, so the dry run does too)."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    hits: dict[str, set[int]] = defaultdict(set)
    for line in trace.splitlines():
        pid = line.split()[0] if line[:1].isdigit() else "main"  # -o with -f: each line starts with its pid
        rest = line.split(None, 1)[1] if line[:1].isdigit() else line
        m = LINE.match(rest)
        if not m or m.group(2) not in SYSCALLS or "resumed>" in rest:
            continue
        name = m.group(2)
        counts[(pid, name)] += 1
        if str(dest) in m.group(3):
            hits[name].add(counts[(pid, name)])
    return {k: sorted(v) for k, v in hits.items()}


COMMANDS = {
    "pull": (["pull", "--profile", PROFILE, "--channel", "prod", "--dest", "{dest}", "--skip-preflight", "--json"],
             "before", "node"),
    "stage": (["pull", "--profile", PROFILE, "--channel", "prod", "--dest", "{dest}", "--for-upgrade",
               "{tmp}/target.yaml", "--stage-only", "--json"], "before", "node"),
    "activate": (["node", "activate", "--profile", PROFILE, "--dest", "{dest}", "--skip-preflight", "--json"],
                 "after", "node-staged"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_fault_at_every_syscall_leaves_a_complete_current_and_a_rerun_finishes(node, command, tmp_path,
                                                                                 record_fault):
    template_args, fp_name, template = COMMANDS[command]
    ids, store = node["ids"], node["store"]
    template_dir = node["tmp"] / template
    dest = tmp_path / "dest"
    argv = [a.format(dest=dest, tmp=node["tmp"]) for a in template_args]
    env = {**os.environ, "BUILDCTL_STORE": store.uri, "BUILDCTL_FINGERPRINT_FILE": str(node["tmp"] / f"fp-{fp_name}.json"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    before = _state(template_dir)
    assert before == (ids["a"], ids["p0"])
    new = {"pull": ids["b"], "stage": None, "activate": ids["c"]}[command]
    after = (new, ids["a"]) if new else before
    allowed = {before, after, (ids["a"], ids["a"])}

    def restore() -> None:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(template_dir, dest, symlinks=True)

    def staged_ok() -> bool:
        from buildctl.artifact_store.node.install_dir import staged_engines

        entries = [e for e in staged_engines(dest) if e.artifact_id == ids["c"]]
        return bool(entries) and not _complete(store, dest, ids["c"])

    restore()
    trace = tmp_path / "trace.txt"
    dry = _strace(trace, argv, env, "-y", "-e", "trace=" + ",".join(SYSCALLS))
    assert dry.returncode == 0, dry.stderr[-3000:]
    calls = _calls_touching(dest, trace.read_text())
    assert calls.get("renameat2") or calls.get("rename") or calls.get("renameat"), calls  # the trace saw the work
    print(command, {k: len(v) for k, v in calls.items()})
    injected, failures = [], []
    for name, numbers in sorted(calls.items()):
        for n in numbers:
            for fault in FAULTS:
                restore()
                r = _strace(trace, argv, env, "-y", "-e", f"trace={name}", "-e", f"inject={name}:{fault}:when={n}")
                injected.append(f"{name}#{n}:{fault}")
                state = _state(dest)
                why = []
                if state not in allowed:
                    why.append(f"state {state}")
                elif state[0] and _complete(store, dest, state[0]):
                    why.append(f"current incomplete: {_complete(store, dest, state[0])}")
                ok_codes = {"error=ENOSPC": {0, 12}, "signal=SIGINT": {0, 130}, "signal=SIGKILL": {-9, 137}}[fault]
                if r.returncode not in ok_codes:
                    why.append(f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1:] if r.stderr else ''}")
                if r.returncode == 0 and (state != after or (command == "stage" and not staged_ok())):
                    why.append(f"exit 0 with the work not done: {state}")
                if fault != "signal=SIGKILL" and "Traceback" in r.stderr:
                    why.append("traceback: " + r.stderr[-1500:])
                again = subprocess.run([sys.executable, "-m", "buildctl", *argv], cwd=REPO, env=env,
                                       capture_output=True, text=True, timeout=300)
                if again.returncode != 0 or _state(dest) != after:
                    why.append(f"re-run exit {again.returncode}, state {_state(dest)}: {again.stderr[-300:]}")
                elif command == "stage" and not staged_ok():
                    why.append("re-run left no complete staged engine")
                elif _leftovers(dest):
                    why.append(f"re-run left {_leftovers(dest)}")
                if why:
                    hit = [ln for ln in trace.read_text().splitlines() if "INJECTED" in ln or "+++ killed" in ln]
                    failures.append(f"{name}#{n} {fault}: " + "; ".join(why) + f" [{' | '.join(hit)[:300]}]")
    record_fault(f"crash consistency: {command}", f"{len(injected)} injections: "
                 + ", ".join(f"{k} x{len(v)}" for k, v in sorted(calls.items())), len(injected),
                 outcome="ok" if not failures else f"{len(failures)} failed")
    assert not failures, "\n".join(failures[:40])
