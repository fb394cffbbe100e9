"""The architecture's rules, checked: import-linter contracts (and that they can fail), one
import namespace, settings as the only environment reader, the backend registry, the CLI's
exit-code table and help output."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, settings

BIN = Path(sys.executable).parent
PACKAGE_DIRS = ("buildctl", "engines", "artifact_store", "validators", "flows")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "400"}  # this tree's buildctl; one line a contract
    return subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_import_linter_contracts_hold():
    r = lint_imports(REPO)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout and "5 kept" in r.stdout


VIOLATIONS = {
    # (file under the copied tree, line appended, the contract it must break)
    "prefect-in-engines": ("engines/profile.py", "import prefect", "Prefect only in the flows"),
    "prefect-via-cli": ("buildctl/cli/store.py", "import buildctl.flows.pipeline", "Prefect only in the flows"),
    "boto3-in-local-store": ("artifact_store/local.py", "import boto3", "boto3 only in the S3 store"),
    "vllm-in-speed": ("validators/speed.py", "import vllm", "vllm only in the reference runner"),
    "torch-in-pipeline": ("buildctl/pipeline.py", "import torch", "torch only in the aoti backend"),
    "store-imports-pipeline": ("artifact_store/verify.py", "import buildctl.pipeline", "Layers"),
    "engines-import-store": ("engines/model_hub.py", "import buildctl.store.backend", "Layers"),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_each_contract_catches_a_violation(case, tmp_path):
    rel, line, contract = VIOLATIONS[case]
    for d in PACKAGE_DIRS:
        shutil.copytree(REPO / d, tmp_path / d, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / rel
    target.write_text((target.read_text() if target.exists() else "") + f"\n{line}\n")
    r = lint_imports(tmp_path)
    assert r.returncode != 0, r.stdout[-3000:]
    broken = [ln for ln in r.stdout.splitlines() if "BROKEN" in ln]
    assert any(contract in ln for ln in broken), r.stdout[-3000:]


def _library_modules() -> list[Path]:
    root = REPO / "buildctl"
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _env_reads(tree: ast.AST) -> list[int]:
    """Lines that read the environment: os.environ.get/[...]/in, os.getenv."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os":
                lines.append(node.lineno)
            if (f.attr in ("get", "__getitem__", "copy", "items", "keys") and isinstance(f.value, ast.Attribute)
                    and f.value.attr == "environ"):
                lines.append(node.lineno)
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "environ":
            lines.append(node.lineno)
        if isinstance(node, ast.Compare) and any(isinstance(c, ast.Attribute) and c.attr == "environ"
                                                 for c in node.comparators):
            lines.append(node.lineno)
    return lines


def test_only_settings_reads_the_environment():
    """Library code takes configuration from Settings; copying the environment to a child process
    (``dict(os.environ)``) and setting variables before importing vllm are not reads."""
    offenders = {}
    for p in _library_modules():
        if p.name == "settings.py":
            continue
        found = _env_reads(ast.parse(p.read_text(), str(p)))
        if found:
            offenders[str(p.relative_to(REPO))] = found
    assert offenders == {}
    # the check itself sees a read
    assert _env_reads(ast.parse("import os\nx = os.environ.get('A')\ny = os.getenv('B')\nz = os.environ['C']\n")) == [2, 3, 4]


def _exit_literals(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("exit", "Exit") \
                and any(isinstance(a, ast.Constant) and isinstance(a.value, int) for a in node.args):
            lines.append(node.lineno)
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) \
                and node.left.attr in ("returncode", "exit_code"):
            consts = [c for c in node.comparators if isinstance(c, ast.Constant)] + \
                     [e for c in node.comparators if isinstance(c, ast.Tuple) for e in c.elts]
            if any(isinstance(c, ast.Constant) and isinstance(c.value, int) and c.value != 0 for c in consts):
                lines.append(node.lineno)
    return lines


def test_no_exit_code_literal_outside_the_table():
    """``sys.exit(N)``, ``typer.Exit(N)`` and ``returncode == N`` with a literal N appear nowhere but
    the CLI's table (the preflight program's own REFUSED status is a named constant)."""
    offenders = {str(p.relative_to(REPO)): found for p in _library_modules()
                 if (found := _exit_literals(ast.parse(p.read_text(), str(p))))}
    assert offenders == {}
    assert _exit_literals(ast.parse("import sys\nsys.exit(5)\nif r.returncode in (0, 5):\n    pass\n")) == [2, 3]


def test_unknown_backend_is_bad_input_listing_the_known_ones(cli, tmp_path):
    from buildctl.engines.errors import UnknownBackendError
    from buildctl.engines.registry import backend_names, get_backend
    from buildctl.errors import BadInputError

    with pytest.raises(UnknownBackendError) as exc:
        get_backend("tensorrt", settings())
    assert isinstance(exc.value, BadInputError) and exc.value.known == backend_names() == ("trtllm", "aoti")
    assert "known: trtllm, aoti" in str(exc.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: {tiny: {}}\nengine: {backend: tensorrt}\n")
    code, _, err = cli("profile", "check", bad)
    assert code == 2 and "engine.backend" in err and "known-backend" in err and "trtllm, aoti" in err


def test_every_backend_implements_the_protocol():
    from buildctl.engines.backend import EngineBackend
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.registry import backend_class, backend_names

    fp = detect()
    for name in backend_names():
        cls = backend_class(name)
        backend = cls(settings())
        assert isinstance(backend, EngineBackend) and cls.name == name
        assert isinstance(cls.compat_fields(fp), dict) and "backend" not in cls.compat_fields(fp)
        assert fp.compat_fields(name)["backend"] == name
        assert fp.compat_key(name).startswith(f"{name}-")


def test_settings_flags_win_over_environment_and_are_frozen(monkeypatch, tmp_path):
    from pydantic import ValidationError

    from buildctl.errors import BadInputError
    from buildctl.settings import load_settings

    monkeypatch.setenv("BUILDCTL_STORE", "file:///from/env")
    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(tmp_path))
    s = load_settings(store=None)
    assert s.store == "file:///from/env" and s.profile_dir == tmp_path
    assert load_settings(store="s3://bucket/flag").store == "s3://bucket/flag"
    with pytest.raises(ValidationError):
        s.store = "x"  # type: ignore[misc]
    monkeypatch.setenv("BUILDCTL_BUILD_SLOTS", "zero")
    with pytest.raises(BadInputError) as exc:
        load_settings()
    assert "build_slots" in str(exc.value)


def test_cli_imports_no_prefect():
    code = ("import sys, buildctl.cli.main, buildctl.pipeline, buildctl.fleet; "
            "bad = sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')); "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_help_has_no_bool_metavars():
    for args in (["--help"], ["pull", "--help"], ["verify", "--help"], ["gc", "--help"]):
        r = subprocess.run([sys.executable, "-m", "buildctl", *args], capture_output=True, text=True, cwd=REPO,
                           env={**os.environ, "COLUMNS": "120"})
        assert r.returncode == 0 and "--json" in r.stdout, r.stderr
        assert "<bool>" not in r.stdout, r.stdout
    assert "<int" in subprocess.run([sys.executable, "-m", "buildctl", "pull", "--help"], capture_output=True,
                                    text=True, cwd=REPO).stdout  # options that take values keep their type


def test_backends_type_check_against_the_protocol():
    """mypy checks every registered backend class against ``EngineBackend`` (the registry names
    them under TYPE_CHECKING), so a backend missing an operation or with a wrong signature fails."""
    files = [str(REPO / "buildctl" / "engines" / f) for f in ("registry.py", "backend.py", "aoti.py", "trtllm.py")]
    r = subprocess.run([str(BIN / "mypy"), "--follow-imports=silent", "--ignore-missing-imports", "--no-incremental",
                        *files], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
