"""The backend contract: every registered backend passes each clause here, or fails with the clause's
name. A new backend adds one way to make a sample (:data:`SAMPLES`), and the clauses run over it:

* **sample**: a tree it built (aoti: the tiny Llama, for real; trtllm and trtllm-torch: against the
  strict fakes) or imported (vllm: a bundle-shaped tree; its real build is slow:
  tests/engines/vllm/test_bundle_e2e.py) is recognised by that backend and by no other;
* **compat key**: the key hashes exactly the hard fields: each hard field's change changes it, a
  soft-only change does not;
* **fields**: every field is hard or soft with an upstream source and a path of the fingerprint,
  every floor reads fingerprint paths, and ``fingerprint --json`` lists the backend with them;
* **damaged tree**: a tree missing, or with garbage in, the file the backend recognises it by is
  refused by preflight with a buildctl error (a documented exit code), never another exception;
* **manifest round trip**: published, the manifest lists every file with hashes that verify;
* **install read-only**: installed from the store, every file is read-only and still recognised;
* **import**: ``buildctl import`` publishes the sample under its own profile and fingerprint; it
  refuses it under a profile of another backend (naming both), and, where the tree records the host
  it was made for, under a fingerprint of another compat key (naming the field); a refused import
  publishes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from buildctl.core.errors import BuildctlError
from buildctl.core.settings import Settings
from buildctl.engines.compat import value_at
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import BuildProfile, load_profile, parse_profile
from buildctl.engines.registry import backend_class, backend_names, backend_of_engine_dir

from ..support.helpers import PROFILES
from ..support.trtllm_kit import FAKES, h100x8, profile_yaml, use_release
from ..support.trtllm_torch_kit import checkpoint, small_profile, torch_host, use_host


@dataclass
class Sample:
    profile: BuildProfile
    fingerprint: Fingerprint
    tree: Path
    how: str  # "built" or "imported"


def _aoti(request, tmp_path: Path, monkeypatch) -> Sample:
    from buildctl.engines.fingerprint import detect

    tb = request.getfixturevalue("tiny_build")
    tree = tmp_path / "engine"
    shutil.copytree(Path(tb["engine"]).resolve(), tree, copy_function=shutil.copyfile)
    return Sample(tb["profile"], detect(), tree, "built")


def _trtllm(request, tmp_path: Path, monkeypatch) -> Sample:
    from buildctl.engines.trtllm.backend import TrtllmBackend

    use_release(monkeypatch, "1.2.1")
    monkeypatch.syspath_prepend(str(FAKES / "pymods"))
    calib = tmp_path / "calibration"
    calib.mkdir()
    (calib / "calib.jsonl").write_text('{"text": "local calibration text"}\n')
    profile = load_profile(profile_yaml(tmp_path, calib))
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "vocab_size": 1024}')
    (model / "model.safetensors").write_bytes(b"weights")
    fp = h100x8()
    fpf = tmp_path / "fp.json"
    fpf.write_text(fp.model_dump_json())
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fpf))
    TrtllmBackend(Settings()).build(profile, model, tmp_path / "engine", fp, tmp_path / "build.log")
    return Sample(profile, fp, tmp_path / "engine", "built")


def _vllm(request, tmp_path: Path, monkeypatch) -> Sample:
    """A bundle-shaped tree (the record, the model, a compile-cache hash folder) for this host."""
    from buildctl.engines.fingerprint import detect

    fp = detect()
    profile = load_profile(PROFILES / "tiny-llama-vllm-cpu.yaml")
    tree = tmp_path / "engine"
    (tree / "model").mkdir(parents=True)
    (tree / "model" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (tree / "model" / "model.safetensors").write_bytes(os.urandom(4096))
    cache = tree / "caches" / "vllm" / "torch_compile_cache" / "torch_aot_compile" / "abc123"
    cache.mkdir(parents=True)
    (cache / "kernel.so").write_bytes(os.urandom(2048))
    (tree / "bundle.json").write_text(json.dumps({
        "format": 1, "backend": "vllm", "runtime": "vllm", "compat_key": fp.compat_key("vllm"),
        "compat_fields": fp.compat_fields("vllm"), "engine_args": {"model": "model"}, "env": {},
        "hash_dirs": ["vllm/torch_compile_cache/torch_aot_compile/abc123"], "device": "cpu"}))
    return Sample(profile, fp, tree, "imported")


def _trtllm_torch(request, tmp_path: Path, monkeypatch) -> Sample:
    from buildctl.engines.trtllm_torch.backend import TrtllmTorchBackend

    fp = torch_host("1.2.1")
    use_host(monkeypatch, tmp_path, fp)
    profile = small_profile()
    TrtllmTorchBackend(Settings()).build(profile, checkpoint(tmp_path / "model"), tmp_path / "engine", fp,
                                         tmp_path / "build.log")
    return Sample(profile, fp, tmp_path / "engine", "built")


SAMPLES = {"aoti": _aoti, "trtllm": _trtllm, "vllm": _vllm, "trtllm-torch": _trtllm_torch}


@pytest.fixture(params=backend_names())
def sample(request, tmp_path, monkeypatch) -> tuple[str, Sample]:
    name = request.param
    make = SAMPLES.get(name)
    assert make is not None, f"contract clause 'sample': backend {name!r} has no way to make a sample in SAMPLES"
    return name, make(request, tmp_path, monkeypatch)


def test_every_registered_backend_has_a_sample_and_no_sample_is_stale():
    assert sorted(SAMPLES) == sorted(backend_names())


def test_clause_sample_is_recognised_by_its_backend_and_no_other(sample):
    name, s = sample
    assert backend_of_engine_dir(s.tree) == name, f"clause 'sample': {name} does not recognise its own tree"
    others = [b for b in backend_names() if b != name and backend_class(b).recognises(s.tree)]
    assert others == [], f"clause 'sample': {others} also recognise a {name} tree"


def _fingerprint_with(fp: Fingerprint, path: str, *, major: bool) -> Fingerprint:
    """``fp`` with the value at ``path`` changed: its major part too when ``major``, else only a
    trailing part."""
    data = fp.model_dump(mode="json")
    head, _, rest = path.partition(".")

    def bump(v):
        if isinstance(v, list):
            return [*v, "changed"]
        s = str(v) if v is not None else "1.0"
        return f"9{s}" if major else f"{s}.9"

    if head == "gpus":
        data["gpus"] = [{**g, rest: bump(g.get(rest))} for g in data["gpus"]]
    elif rest:
        data[head] = {**data[head], rest: bump(data[head].get(rest))}
    else:
        data[head] = bump(data.get(head))
    return Fingerprint.model_validate(data)


def _with_a_gpu(fp: Fingerprint) -> Fingerprint:
    """``fp``, given one H100 if it has no GPU (so a change of a GPU field is a change)."""
    return fp if fp.gpus else fp.model_copy(update={"gpus": h100x8(gpus=1).gpus})


def test_clause_compat_key_hashes_exactly_the_hard_fields(sample):
    name, s = sample
    cls = backend_class(name)
    fp = _with_a_gpu(s.fingerprint)
    assert set(fp.compat_fields(name)) - {"backend"} == {f.label for f in cls.compat if f.kind == "hard"}, \
        f"clause 'compat key': {name}'s compat fields are not its hard fields"
    for f in cls.compat:
        if f.kind == "hard":
            assert _fingerprint_with(fp, f.path, major=True).compat_key(name) != fp.compat_key(name), \
                f"clause 'compat key': {name}'s key ignores its hard field {f.label}"
    hard_values = {f.path for f in cls.compat if f.kind == "hard" and f.part == "value"}
    for f in cls.compat:
        if f.kind == "soft" and f.path not in hard_values:
            assert _fingerprint_with(fp, f.path, major=False).compat_key(name) == fp.compat_key(name), \
                f"clause 'compat key': {name}'s key changes with its soft field {f.label}"


def test_clause_fields_each_field_and_floor_names_its_source_and_a_fingerprint_path(sample):
    name, s = sample
    cls = backend_class(name)
    data = s.fingerprint.model_dump(mode="json")
    for f in cls.compat:
        assert f.kind in ("hard", "soft") and f.source.strip(), f"clause 'fields': {name}.{f.path}"
        assert f.path.split(".", 1)[0] in Fingerprint.model_fields, f"clause 'fields': {name}.{f.path} is no fingerprint path"
        value_at(data, f.path)
    for fl in cls.floors:
        assert fl.name and fl.source.strip() and all(p.split(".", 1)[0] in Fingerprint.model_fields for p in fl.paths)
    listed = s.fingerprint.backends_json()[name]
    assert listed["compat_key"] == s.fingerprint.compat_key(name)
    assert [(f["path"], f["kind"]) for f in listed["fields"] if f["kind"] != "floor"] == [
        (f.path, f.kind) for f in cls.compat], "clause 'fields': fingerprint --json lists other fields"
    assert [f["name"] for f in listed["fields"] if f["kind"] == "floor"] == [fl.name for fl in cls.floors]


def _marker(name: str, tree: Path) -> Path:
    """The file the backend recognises ``tree`` by: the smallest file whose loss it notices."""
    cls = backend_class(name)
    for p in sorted((p for p in tree.rglob("*") if p.is_file()), key=lambda p: (p.stat().st_size, str(p))):
        keep = p.read_bytes()
        p.unlink()
        try:
            if not cls.recognises(tree):
                return p
        finally:
            p.write_bytes(keep)
    raise AssertionError(f"clause 'damaged tree': {name} recognises its tree whatever file is missing")


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_clause_damaged_tree_is_refused_by_preflight_with_a_buildctl_error(sample, damage):
    name, s = sample
    marker = _marker(name, s.tree)
    if damage == "missing":
        marker.unlink()
    else:
        marker.write_bytes(b"\x00not what the backend wrote\xff")
    from buildctl.cli.main import exit_code_for

    with pytest.raises(BuildctlError) as err:
        backend_class(name)(Settings()).preflight(s.tree)
    assert exit_code_for(err.value) == 2, f"clause 'damaged tree': {name} refused with {type(err.value).__name__}"


def test_clause_manifest_round_trip_and_install_read_only(sample, tmp_path):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.manifest import parse_manifest
    from buildctl.artifact_store.node.install_dir import install_artifact, local_problems
    from buildctl.artifact_store.read import get_manifest_and_bytes
    from buildctl.core.digest import digest_bytes
    from buildctl.steps.build import manifest_draft

    from ..support.helpers import publish_files

    name, s = sample
    store = open_store(str(tmp_path / "store"))
    aid = publish_files(store, s.tree, manifest_draft(s.profile, s.fingerprint))
    m, body = get_manifest_and_bytes(store, aid)
    files = sorted(p.relative_to(s.tree).as_posix() for p in s.tree.rglob("*") if p.is_file())
    assert m.backend == name and sorted(f.path for f in m.files) == files, "clause 'manifest round trip'"
    assert digest_bytes(body) == aid and parse_manifest(body, "round trip") == m, "clause 'manifest round trip'"
    install_artifact(store, aid, tmp_path / "node")
    current = (tmp_path / "node" / "current").resolve()
    assert local_problems(m, current) == [], "clause 'install read-only': the install does not verify"
    writable = [p for p in current.rglob("*") if p.is_file() and p.stat().st_mode & 0o222]
    assert writable == [], f"clause 'install read-only': {name} installs writable files {writable[:3]}"
    assert backend_of_engine_dir(current) == name, "clause 'install read-only': the install is not recognised"


def _another_backends_profile(name: str) -> BuildProfile:
    return load_profile(PROFILES / ("tiny-llama-vllm-cpu.yaml" if name == "aoti" else "tiny-llama-cpu.yaml"))


def test_clause_import_publishes_its_own_and_refuses_a_misrouted_or_another_hosts_tree(sample, tmp_path):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.read import list_artifacts
    from buildctl.cli.main import exit_code_for
    from buildctl.steps.build import import_engine
    from buildctl.steps.context import Context

    name, s = sample
    refused = open_store(str(tmp_path / "refused"))
    ctx = Context.from_settings(Settings(), store=refused)
    other = _another_backends_profile(name)
    with pytest.raises(BuildctlError) as err:
        import_engine(ctx, s.tree, other, s.fingerprint)
    assert exit_code_for(err.value) == 2 and name in str(err.value) and other.engine.backend in str(err.value), \
        f"clause 'import': a {name} tree imported as {other.engine.backend}: {err.value}"
    if backend_class(name).records_host:
        hard = next(f for f in backend_class(name).compat if f.kind == "hard" and f.path != "platform")
        elsewhere = _fingerprint_with(_with_a_gpu(s.fingerprint), hard.path, major=True)
        with pytest.raises(BuildctlError) as err:
            import_engine(ctx, s.tree, s.profile, elsewhere)
        assert exit_code_for(err.value) == 2, f"clause 'import': {name} for another host: {type(err.value).__name__}"
    assert list(list_artifacts(refused)) == [], "clause 'import': a refused import published"
    ok = import_engine(Context.from_settings(Settings(), store=open_store(str(tmp_path / "store"))), s.tree,
                       s.profile, s.fingerprint)
    assert ok.manifest.backend == name and ok.manifest.compat_key == s.fingerprint.compat_key(name)
