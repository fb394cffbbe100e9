"""The architecture's rules, checked: import-linter contracts (and that they can fail), one
import namespace, settings as the only environment reader, the backend registry, the CLI's
exit-code table and help output."""

from __future__ import annotations

import ast
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .support.helpers import MODULES_PARSED, REPO, settings

BIN = Path(sys.executable).parent
# The packages whose modules the AST guards below must see: each is a real folder under buildctl/.
LIBRARY_PACKAGES = ("artifact_store", "cli", "core", "engines", "flows", "steps", "validators")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "400"}  # this tree's buildctl; one line a contract
    return subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_import_linter_contracts_hold():
    r = lint_imports(REPO)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout and "9 kept" in r.stdout


VIOLATIONS = {
    # (file under the copied tree, line appended, the contract it must break)
    "prefect-in-engines": ("buildctl/engines/profile.py", "import prefect", "Prefect only in the flows"),
    "prefect-via-cli": ("buildctl/cli/pull.py", "import buildctl.flows.build_validate_publish", "Prefect only in the flows"),
    "boto3-in-local-store": ("buildctl/artifact_store/backends/local.py", "import boto3", "boto3 only in the S3 store"),
    "vllm-in-speed": ("buildctl/validators/speed.py", "import vllm", "vllm only in the vLLM runtime"),
    "torch-in-the-build-step": ("buildctl/steps/build.py", "import torch", "torch only in the aoti backend"),
    "store-imports-a-step": ("buildctl/artifact_store/read.py", "import buildctl.steps.build", "Layers"),
    "engines-import-store": ("buildctl/engines/model_hub.py", "import buildctl.artifact_store.backends.store", "Layers"),
    "core-imports-steps": ("buildctl/core/times.py", "import buildctl.steps.context", "Layers"),
    "context-imports-a-step": ("buildctl/steps/context.py", "import buildctl.steps.healing", "Steps layers"),
    "errors-import-settings": ("buildctl/core/errors.py", "import buildctl.core.settings", "Core layers"),
    "backend-imports-pull": ("buildctl/artifact_store/backends/local.py", "import buildctl.artifact_store.node.pull", "Store rooms"),
    "trust-imports-quarantine": ("buildctl/artifact_store/trust/binding.py", "import buildctl.artifact_store.quarantine", "Store rooms"),
    "room-imports-room": ("buildctl/engines/vllm/bundle.py", "import buildctl.engines.aoti.backend", "Engine rooms are independent"),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_each_contract_catches_a_violation(case, tmp_path):
    rel, line, contract = VIOLATIONS[case]
    shutil.copytree(REPO / "buildctl", tmp_path / "buildctl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / rel
    target.write_text((target.read_text() if target.exists() else "") + f"\n{line}\n")
    r = lint_imports(tmp_path)
    assert r.returncode != 0, r.stdout[-3000:]
    broken = [ln for ln in r.stdout.splitlines() if "BROKEN" in ln]
    assert any(contract in ln for ln in broken), r.stdout[-3000:]


def _library_modules(root: Path = REPO) -> list[Path]:
    """Every module of the package under ``root``, found by walking ``root/buildctl`` (which
    follows no link: every package folder must be a real one). Fails when a library package
    contributes no module, so a folder that went missing or became a link is noticed."""
    mods = sorted(p for p in (root / "buildctl").rglob("*.py") if "__pycache__" not in p.parts)
    seen = {p.relative_to(root / "buildctl").parts[0] for p in mods}
    missing = [pkg for pkg in LIBRARY_PACKAGES if pkg not in seen]
    assert not missing, f"no module seen in buildctl/{missing}: a missing or linked package folder"
    return mods


def test_the_guards_parse_every_library_module(request):
    """The AST guards see exactly the modules git tracks under buildctl/ (none hidden behind a
    link), and the count is reported at the end of the session."""
    mods = _library_modules()
    tracked = subprocess.run(["git", "ls-files", "-s", "buildctl"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    links = [ln.split("\t")[1] for ln in tracked if ln.startswith("120000")]
    assert links == []  # no symlinked package folder (or file) under buildctl/
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "buildctl"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    py = sorted({REPO / f for f in files if f.endswith(".py") and (REPO / f).exists()})
    assert mods == py
    assert len(mods) >= 80  # 25 when three package folders were links the walk did not enter
    request.config.stash[MODULES_PARSED] = len(mods)


def test_a_library_folder_that_reads_the_environment_is_caught(tmp_path):
    """On a copy of the tree, an ``os.environ`` read in each library package is found, and a
    package folder that went missing fails the walk."""
    shutil.copytree(REPO / "buildctl", tmp_path / "buildctl", ignore=shutil.ignore_patterns("__pycache__"))
    for pkg in LIBRARY_PACKAGES:
        target = next(p for p in sorted((tmp_path / "buildctl" / pkg).glob("*.py")) if p.name != "__init__.py")
        target.write_text(target.read_text() + "\nimport os\nLEAK = os.environ.get('X')\n")
    assert sorted({p.parent.name for p in _env_offenders(tmp_path)}) == sorted(LIBRARY_PACKAGES)
    shutil.rmtree(tmp_path / "buildctl" / "validators")
    with pytest.raises(AssertionError, match="validators"):
        _library_modules(tmp_path)


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


def _env_offenders(root: Path) -> dict[Path, list[int]]:
    return {p: found for p in _library_modules(root) if p.name != "settings.py"
            and (found := _env_reads(ast.parse(p.read_text(), str(p))))}


def test_only_settings_reads_the_environment():
    """Library code takes configuration from Settings; copying the environment to a child process
    (``dict(os.environ)``) and setting variables before importing vllm are not reads."""
    assert {str(p.relative_to(REPO)): lines for p, lines in _env_offenders(REPO).items()} == {}
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
    from buildctl.core.errors import BadInputError

    with pytest.raises(UnknownBackendError) as exc:
        get_backend("tensorrt", settings())
    assert isinstance(exc.value, BadInputError) and exc.value.known == backend_names() == ("trtllm", "aoti", "vllm", "trtllm-torch")
    assert "known: trtllm, aoti, vllm, trtllm-torch" in str(exc.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: {tiny: {}}\nengine: {backend: tensorrt}\n")
    code, _, err = cli("profile", "check", bad)
    assert code == 2 and "engine.backend" in err and "known-backend" in err and "trtllm, aoti, vllm, trtllm-torch" in err


def test_every_backend_implements_the_protocol():
    from buildctl.engines.backend import EngineBackend
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.registry import backend_class, backend_names

    fp = detect()
    for name in backend_names():
        cls = backend_class(name)
        backend = cls(settings())
        assert isinstance(backend, EngineBackend) and cls.name == name
        hard = [f for f in cls.compat if f.kind == "hard"]
        assert hard and all(f.source for f in cls.compat) and all(fl.source for fl in cls.floors)
        assert isinstance(cls.legacy_compat_fields(fp), dict) and "backend" not in cls.legacy_compat_fields(fp)
        assert set(fp.compat_fields(name)) == {"backend", *(f.label for f in hard)}
        assert fp.compat_fields(name)["backend"] == name
        assert fp.compat_key(name).startswith(f"{name}-")


def test_settings_flags_win_over_environment_and_are_frozen(monkeypatch, tmp_path):
    from pydantic import ValidationError

    from buildctl.core.errors import BadInputError
    from buildctl.core.settings import load_settings

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
    code = ("import sys, buildctl.cli.main, buildctl.steps.build, buildctl.steps.fleet; "
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
    # The registry's TYPE_CHECKING tuple is where the check fires; mypy follows it into every
    # registered backend module. Listing those modules too type-checks their bodies as well: 50 s
    # instead of 15 on 2 cores, for errors this test is not about.
    from buildctl.engines import registry

    registered = Path(registry.__file__).read_text().split("_REGISTERED", 1)[1].split("\n\n", 1)[0]
    assert all(t.partition(":")[2] in registered for t in registry.BACKENDS.values()), "a backend is not in _REGISTERED"
    files = [str(REPO / "buildctl" / "engines" / f) for f in ("registry.py", "backend.py")]
    r = subprocess.run([str(BIN / "mypy"), "--follow-imports=silent", "--ignore-missing-imports", "--no-incremental",
                        *files], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]


def _import_cycles(package: str, root: Path | None = None) -> list[list[str]]:
    """Every import circle among ``package``'s modules (strongly connected components of more than
    one module, Tarjan's algorithm), counting every import that runs: module-level and
    function-level; not those under ``if TYPE_CHECKING:`` (they never run)."""
    import grimp

    if root is not None:
        sys.path.insert(0, str(root))
    try:
        g = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    finally:
        if root is not None:
            sys.path.remove(str(root))
    edges = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # iterative depth would need a frame stack; the package is small
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(edges):
        if m not in index:
            visit(m)
    return out


def test_no_import_cycle_inside_the_package():
    """#51: two circles were broken (the store interface and its backends; the engine registry and
    the profile and fingerprint modules); any new one fails here, naming its modules."""
    assert _import_cycles("buildctl") == []


def test_the_store_has_at_most_twelve_modules_at_its_top_level():
    """#51: ``artifact_store`` keeps its store-wide modules at the top and the rest in rooms."""
    top = sorted(p.name for p in (REPO / "buildctl" / "artifact_store").glob("*.py"))
    assert len(top) <= 12, top


def test_the_cycle_check_finds_a_circle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "circlepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circlepkg.b import y\nx = 1\n")
    (pkg / "b.py").write_text("y = 2\ndef f():\n    from circlepkg.a import x\n    return x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circlepkg.a import x\n")
    assert _import_cycles("circlepkg", tmp_path) == [["circlepkg.a", "circlepkg.b"]]


def test_every_model_is_a_frozen_record_that_refuses_unknown_fields():
    """Records are frozen pydantic v2 models with extra="forbid": every model in the package
    derives from buildctl.core.records.Record (the settings: pydantic-settings' base, configured so)."""
    import importlib
    import pkgutil

    from pydantic import BaseModel

    import buildctl
    from buildctl.core.records import Record

    models = set()
    for info in pkgutil.walk_packages(buildctl.__path__, "buildctl."):
        if info.name.startswith(("buildctl.flows", "buildctl.__main__")) or info.name.endswith("vllm.child"):
            continue  # the flows import Prefect, and the vllm child runs as a program
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == info.name:
                models.add(obj)
    assert len(models) > 40
    for cls in sorted(models, key=lambda c: (c.__module__, c.__name__)):
        cfg = cls.model_config
        assert cfg.get("frozen") and cfg.get("extra") == "forbid", f"{cls.__module__}.{cls.__name__}"
        assert issubclass(cls, Record) or cls.__name__ == "Settings", f"{cls.__module__}.{cls.__name__}: not a Record"


def _untested_modules(root: Path = REPO) -> list[str]:
    """Modules of ``root/buildctl`` with neither ``tests/<package path>/test_<module>.py`` nor a row
    in tests/README.md's table of modules tested elsewhere (whose test file must exist)."""
    readme = (root / "tests" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `buildctl/([\w/]+\.py)` \| `(tests/[\w/]+\.py)` \|", readme, flags=re.M))
    out = []
    for p in sorted((root / "buildctl").rglob("*.py")):
        if p.name in ("__init__.py", "__main__.py") or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(root / "buildctl")
        mirror = root / "tests" / rel.parent / f"test_{p.stem}.py"
        named = rows.get(rel.as_posix())
        if not mirror.exists() and not (named and (root / named).exists()):
            out.append(rel.as_posix())
    out += [f"stale row: {m}" for m in rows if not (root / "buildctl" / m).exists()]
    return out


def test_every_module_has_a_mirrored_test_file_or_a_line_naming_where_it_is_tested():
    """#51: tests mirror the package (tests/README.md)."""
    assert _untested_modules() == []


def test_the_mirror_check_names_a_new_module_without_tests_and_a_stale_row(tmp_path):
    (tmp_path / "buildctl" / "steps").mkdir(parents=True)
    (tmp_path / "buildctl" / "steps" / "new.py").write_text("")
    (tmp_path / "buildctl" / "steps" / "old.py").write_text("")
    (tmp_path / "tests" / "steps").mkdir(parents=True)
    (tmp_path / "tests" / "steps" / "test_old.py").write_text("")
    (tmp_path / "tests" / "README.md").write_text("| `buildctl/steps/gone.py` | `tests/steps/test_old.py` | why |\n")
    assert _untested_modules(tmp_path) == ["steps/new.py", "stale row: steps/gone.py"]


def _shadowed_module_uses(root: Path = REPO) -> list[str]:
    """``mod.attr`` inside a function that also binds ``mod`` locally (a parameter, an assignment),
    where ``mod`` is a module imported with ``from buildctl.<package> import mod``: the local name
    wins, and the call fails only when that line runs (a flow's ``profiles`` parameter once hid the
    ``profiles`` step module)."""
    out = []
    for path in _library_modules(root):
        tree = ast.parse(path.read_text())
        modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and (n.module or "").startswith("buildctl") for a in n.names
                   if (root / (n.module or "").replace(".", "/") / f"{a.name}.py").exists()}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = fn.args
            bound = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
            bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for n in ast.walk(fn):
                if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules & bound):
                    out.append(f"{path.relative_to(root)}:{n.lineno}: {n.value.id}.{n.attr} in {fn.name}")
    return sorted(set(out))


def test_no_module_import_is_shadowed_by_a_local_name_where_it_is_used():
    assert _shadowed_module_uses() == []


def test_the_shadow_check_finds_a_parameter_hiding_a_module(tmp_path):
    (tmp_path / "buildctl" / "steps").mkdir(parents=True)
    (tmp_path / "buildctl" / "steps" / "profiles.py").write_text("def load_profiles(s):\n    return {}\n")
    for pkg in LIBRARY_PACKAGES:
        (tmp_path / "buildctl" / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / "buildctl" / pkg / "m.py").write_text("")
    (tmp_path / "buildctl" / "flows" / "f.py").write_text(
        "from buildctl.steps import profiles\n\ndef flow(settings, profiles):\n    return profiles.load_profiles(settings)\n")
    assert _shadowed_module_uses(tmp_path) == ["buildctl/flows/f.py:4: profiles.load_profiles in flow"]


def _code_shape():
    import importlib.util

    spec = importlib.util.spec_from_file_location("code_shape", REPO / "scripts" / "code_shape.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _long_signatures(root: Path = REPO, limit: int = 8) -> list[str]:
    """Functions of ``root/buildctl`` that take more than ``limit`` parameters, typer commands aside
    (their parameters are the command's flags): scripts/code_shape.py counts them."""
    return [f"{rel}:{name} ({n})" for rel, name, _, n, typer_cmd in _code_shape().functions(root)
            if n > limit and not typer_cmd]


def test_no_function_outside_the_typer_commands_takes_more_than_eight_parameters():
    """#51: policy objects, not keyword lists (``PullOptions``, ``GcPolicy``, ``ChannelMove``, ...)."""
    assert _long_signatures() == []


def test_the_signature_check_counts_keywords_and_spares_typer_commands(tmp_path):
    (tmp_path / "buildctl").mkdir()
    nine = ", ".join(f"p{i}" for i in range(6))
    (tmp_path / "buildctl" / "m.py").write_text(
        f"import typer\n\ndef long({nine}, *, a=1, b=2, c=3):\n    pass\n\n"
        f"def eight(self, {nine}, *, a=1, b=2):\n    pass\n\n"
        f"def cmd({nine}, x: int = typer.Option(1), y: int = typer.Option(2), z: int = typer.Option(3)):\n    pass\n\n"
        "class C:\n    def method(self, a, b, c, d, e, f, g, h, *args):\n        pass\n")
    assert _long_signatures(tmp_path) == ["buildctl/m.py:long (9)", "buildctl/m.py:C.method (9)"]
