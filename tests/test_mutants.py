"""tests/mutants.toml, the configuration of ``make mutants``, still describes the code: every
guard module and every test path of its selection exists, and every survivor entry names a line
that is still in its module (an entry is keyed by the line's text, so a moved line keeps it and an
edited one fails here instead of being lost silently)."""

from __future__ import annotations

import runpy
import tomllib

from .support.helpers import REPO

mutants = runpy.run_path(str(REPO / "scripts" / "mutants.py"))
CONF = tomllib.loads((REPO / "tests" / "mutants.toml").read_text())


def test_every_module_and_test_of_a_selection_exists():
    assert len(CONF["modules"]) >= 11
    for module, spec in CONF["modules"].items():
        assert (REPO / module).is_file(), module
        for t in spec["tests"]:
            if t.startswith("tests/"):
                assert (REPO / t.split("::")[0]).is_file(), (module, t)


def test_every_survivor_entry_names_a_line_still_in_its_module():
    entries = CONF["equivalent"] + CONF["killed_since"]
    assert len(entries) >= 100
    lines = {}
    for e in entries:
        assert e["module"] in CONF["modules"], e
        if e["module"] not in lines:
            lines[e["module"]] = {ln.strip() for ln in (REPO / e["module"]).read_text().splitlines()}
        assert e["source"] in lines[e["module"]], f"{e['module']}: no line `{e['source']}` any more: update its entry"
    for e in CONF["killed_since"]:
        assert (REPO / e["test"].split("::")[0]).is_file(), e["test"]


def test_an_entry_follows_its_line_and_a_stale_one_is_reported():
    """The report matches survivors by text: the same line at another number keeps its reason, and
    an entry whose line no survivor has is listed as stale."""
    conf = {"equivalent": [{"module": "buildctl/m.py", "operator": "NumberReplacer", "source": "x = 1", "why": "same"},
                           {"module": "buildctl/m.py", "operator": "AddNot", "source": "if y:", "why": "gone"}],
            "killed_since": []}
    run = {"module": "buildctl/m.py", "killed": 9, "survived": 1, "skipped": 0, "incompetent": 0, "pending": 0, "seconds": 60,
           "survivors": [{"operator": "NumberReplacer", "line": 40, "function": "f", "occurrence": 0, "source": "x = 1"}]}
    (r,) = mutants["annotate"]([run], conf)
    assert r["survivors"][0]["equivalent"] == "same" and r["equivalent"] == 1 and r["score"] == 1.0
    assert r["stale_entries"] == ["AddNot: `if y:`"]
    assert "matched no survivor" in mutants["report"]([r], [])


def test_an_entry_with_an_offset_covers_that_number_mutant_only():
    """cosmic-ray makes a +1 and a -1 mutant of each number (occurrences in turn): `max(0, c)` can
    be equivalent while `max(2, c)` is killed by a later test; an entry's offset tells them apart."""
    conf = {"equivalent": [{"module": "buildctl/m.py", "operator": "NumberReplacer", "source": "n = max(1, c)",
                            "offset": "-1", "why": "c >= 1"}],
            "killed_since": [{"module": "buildctl/m.py", "operator": "NumberReplacer", "source": "n = max(1, c)",
                              "offset": "+1", "test": "tests/test_m.py::test_one"},
                             {"module": "buildctl/m.py", "operator": "NumberReplacer", "source": "k = 2",
                              "offset": "+1", "test": "tests/test_m.py::test_two"}]}
    survivors = [{"operator": "NumberReplacer", "line": 7, "function": "f", "occurrence": occ, "source": src}
                 for occ, src in [(4, "n = max(1, c)"), (5, "n = max(1, c)"), (9, "k = 2")]]
    run = {"module": "buildctl/m.py", "killed": 7, "survived": 3, "skipped": 0, "incompetent": 0, "pending": 0,
           "seconds": 60, "survivors": survivors}
    (r,) = mutants["annotate"]([run], conf)
    assert [(s["equivalent"], s["killed_since"]) for s in r["survivors"]] == [
        (None, "tests/test_m.py::test_one"), ("c >= 1", None), (None, None)]
    assert r["stale_entries"] == ["NumberReplacer +1: `k = 2`"]
    assert "NumberReplacer -1: `k = 2`: open" in mutants["report"]([r], [])


select = runpy.run_path(str(REPO / "scripts" / "mutants_tests.py"))


def test_a_mutant_inside_a_function_runs_only_the_tests_that_executed_its_lines_in_collection_order():
    src = "X = 1\n\n\ndef f(a=2):\n    y = a\n    return y\n\n\nclass C:\n    z = 3\n\n    def g(self):\n        return 4\n"
    body = select["body_lines"](src)
    assert body == {5, 6, 13}  # the default argument, the class attribute and the defs run at import
    mapping = {"order": ["t::a", "t::b", "t::c"], "body": sorted(body),
               "lines": {"5": ["t::c", "t::a"], "6": ["t::b"], "13": ["", "t::a"], "1": [""], "4": [""]}}
    chosen = select["chosen_tests"]
    assert chosen(mapping, [5]) == ["t::a", "t::c"]
    assert chosen(mapping, [5, 6]) == ["t::a", "t::b", "t::c"]
    # every case that cannot be narrowed runs the whole selection: import-time lines, a line also run
    # outside any test (the "" context), a line no test executed, no changed line at all
    for lines in ([1], [4], [10], [13], [5, 13], [99], []):
        assert chosen(mapping, lines) is None, lines


def test_the_changed_lines_are_read_from_the_clones_diff(tmp_path, monkeypatch):
    import subprocess

    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "m.py").write_text("a = 1\nb = 2\nc = 3\nd = 4\n")
    git("add", "m.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x")
    (tmp_path / "m.py").write_text("a = 1\nb = 2\nc = 4\nd = 4\n")
    monkeypatch.chdir(tmp_path)
    assert select["changed_lines"]("m.py") == [3]
    (tmp_path / "m.py").write_text("a = 1\nb = 3\nc = 4\nd = 4\n")
    assert select["changed_lines"]("m.py") == [2, 3]
