from __future__ import annotations

from buildctl.validators.prompts import LONG_MIN, build_prompt_sets


def test_builtin_sets_are_deterministic_and_fit():
    a = build_prompt_sets(["short", "mixed", "long"], max_input_len=7168, max_seq_len=8192, max_tokens=64, vocab_size=32000)
    b = build_prompt_sets(["short", "mixed", "long"], max_input_len=7168, max_seq_len=8192, max_tokens=64, vocab_size=32000)
    assert a.prompts == b.prompts and a.digest() == b.digest() and a.skipped == []
    assert a.sources.count("short") == 8 and a.sources.count("long") == 4
    assert all(4 <= len(p) <= 16 for p, s in zip(a.prompts, a.sources) if s == "short")
    longs = [p for p, s in zip(a.prompts, a.sources) if s == "long"]
    assert all(LONG_MIN <= len(p) <= 7168 for p in longs)
    assert all(0 <= t < 32000 for p in a.prompts for t in p)


def test_long_set_skipped_when_the_engine_is_too_short():
    s = build_prompt_sets(["short", "long"], max_input_len=1024, max_seq_len=2048, max_tokens=32, vocab_size=1024)
    assert s.skipped == ["long: max input 1024 tokens < 4097"] and set(s.sources) == {"short"}
    mixed = build_prompt_sets(["mixed"], max_input_len=1024, max_seq_len=2048, max_tokens=32, vocab_size=1024)
    assert max(len(p) for p in mixed.prompts) == 1024 and min(len(p) for p in mixed.prompts) == 16
