"""Per-mutant test selection for ``make mutants`` (scripts/mutants.py), from coverage.py's contexts.

Two roles in one file:

* a pytest plugin (``-p mutants_tests``, under ``coverage run``): it switches coverage.py's dynamic
  context to each test's node id (``Coverage.switch_context``, the API pytest-cov's ``--cov-context``
  uses) and writes the collection order, so the coverage data says which tests execute each line;
* ``python scripts/mutants_tests.py select MAP MODULE -- PYTEST-ARGS``: cosmic-ray's test command.
  It reads which lines of MODULE the applied mutant changed (``git diff -U0`` in the clone) and runs
  only the tests that executed those lines, in collection order, with ``pytest -x``. A test that never
  executes a line cannot see its mutation, so the verdict equals the whole selection's, except where
  code runs at import: a changed line outside every function body (a default argument, a decorator,
  a class attribute, a module constant), or one no test executed, runs the whole selection.

``python scripts/mutants_tests.py map DATAFILE MODULE ORDER OUT`` turns a coverage data file into
the map: ``{"order": [...node ids...], "lines": {"LINE": [...node ids...]}, "body": [...lines inside
function bodies...]}``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ORDER_ENV = "MUTANTS_ORDER_FILE"


# --- the pytest plugin -------------------------------------------------------------------------

def pytest_collection_modifyitems(session, config, items):  # noqa: ARG001 - pytest's hook signature
    out = os.environ.get(ORDER_ENV)
    if out:
        Path(out).write_text(json.dumps([i.nodeid for i in items]))


def pytest_runtest_setup(item):
    import coverage

    os.environ["MUTANTS_TEST_ID"] = item.nodeid  # a subprocess's static context (the coverage rc file reads it)
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)


# --- the map -----------------------------------------------------------------------------------

def body_lines(source: str) -> set[int]:
    """Lines inside some function's body (their code runs when the function is called, never at import)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            body = node.body if isinstance(node.body, list) else [node.body]
            for stmt in body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def build_map(datafile: str, module: str, order_file: str, out: str) -> None:
    from coverage import CoverageData

    data = CoverageData(basename=datafile)
    data.read()
    path = next((f for f in data.measured_files() if f.endswith(module)), None)
    lines: dict[str, list[str]] = {}
    if path is not None:
        for line, contexts in data.contexts_by_lineno(path).items():
            lines[str(line)] = sorted(set(contexts))
    Path(out).write_text(json.dumps({"order": json.loads(Path(order_file).read_text()), "lines": lines,
                                     "body": sorted(body_lines(Path(module).read_text()))}))


# --- the test command ----------------------------------------------------------------------------

def changed_lines(module: str) -> list[int]:
    """The original file's lines that the working copy's mutation replaced."""
    diff = subprocess.run(["git", "diff", "-U0", "HEAD", "--", module], capture_output=True, text=True,
                          check=True).stdout
    got: list[int] = []
    for m in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+", diff, re.M):
        start, count = int(m.group(1)), int(m.group(2) or 1)
        got.extend(range(start, start + max(count, 1)))
    return got


def chosen_tests(mapping: dict, lines: list[int]) -> list[str] | None:
    """The tests to run for a mutant on these lines, or None for the whole selection."""
    body = set(mapping["body"])
    if not lines or any(line not in body for line in lines):
        return None
    wanted: set[str] = set()
    for line in lines:
        contexts = mapping["lines"].get(str(line))
        if not contexts or "" in contexts:
            return None
        wanted.update(contexts)
    order = {nodeid: i for i, nodeid in enumerate(mapping["order"])}
    return sorted(wanted, key=lambda n: order.get(n, len(order)))


def select(map_file: str, module: str, fallback: list[str]) -> int:
    mapping = json.loads(Path(map_file).read_text())
    tests = chosen_tests(mapping, changed_lines(module))
    # hypothesis's pytest plugin costs 1.2 s of imports per run, half of a narrowed run; @given
    # tests run without it (the selection's own files import hypothesis where they use it)
    args = fallback if tests is None else ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *tests]
    return subprocess.run([sys.executable, "-m", "pytest", *args]).returncode


def main(argv: list[str]) -> int:
    if argv[:1] == ["map"]:
        build_map(*argv[1:5])
        return 0
    if argv[:1] == ["select"] and "--" in argv:
        cut = argv.index("--")
        map_file, module = argv[1:cut]
        return select(map_file, module, argv[cut + 1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
