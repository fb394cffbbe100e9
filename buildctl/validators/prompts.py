"""Prompt sets: deterministic, built in, and a user-supplied JSONL file.

Prompts are token ids. Where the model directory has a tokenizer, prompts are seeded windows of
the shipped corpus (``engines/data/corpus.txt``, repeated as needed), so they are in
distribution for the tiny model and ordinary text for a real one; otherwise seeded random ids.

* ``short``: 8 prompts of 4-16 tokens;
* ``mixed``: 8 prompts from 16 tokens up to ``max_input_len`` (at most 2,048);
* ``long``: 4 prompts above 4,096 tokens, wherever ``max_seq_len`` allows it (production reports
  show irregular shapes above 4,096 tokens crashing CUDA-graph capture, so long inputs must be
  exercised before promotion). Skipped, and reported as skipped, when the engine is too short.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from buildctl.core.digest import digest_json
from buildctl.engines.tiny import CORPUS
from buildctl.validators.errors import PromptFileError, UnknownPromptSetError

KNOWN_SETS = ("short", "mixed", "long")

LONG_MIN = 4097
SEED = 20260101


@dataclass
class PromptSet:
    prompts: list[list[int]]
    sources: list[str]  # which set each prompt came from
    skipped: list[str] = field(default_factory=list)

    def digest(self) -> str:
        return digest_json({"prompts": self.prompts, "sources": self.sources})


def token_source(model_dir: Path | None, vocab_size: int, need: int) -> list[int]:
    ids: list[int] = []
    if model_dir is not None and (model_dir / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        ids = tok(CORPUS.read_text(), add_special_tokens=False)["input_ids"]
    if not ids:
        rng = random.Random(SEED)
        ids = [rng.randrange(4, vocab_size) for _ in range(4096)]
    while len(ids) < need:
        ids = ids + ids
    return ids


def build_prompt_sets(sets: list[str] | tuple[str, ...], *, max_input_len: int, max_seq_len: int, max_tokens: int,
                      vocab_size: int, model_dir: Path | None = None) -> PromptSet:
    """The built-in prompt sets for an engine of these limits."""
    limit = min(max_input_len, max_seq_len - max_tokens)
    source = token_source(model_dir, vocab_size, need=LONG_MIN + 2048)
    rng = random.Random(SEED)

    def window(n: int) -> list[int]:
        start = rng.randrange(0, len(source) - n)
        return source[start:start + n]

    out = PromptSet([], [])
    for name in sets:
        if name == "short":
            lengths = [rng.randint(4, 16) for _ in range(8)]
        elif name == "mixed":
            top = min(limit, 2048)
            lengths = sorted({max(16, min(top, int(16 * (top / 16) ** (i / 7)))) for i in range(8)})
        elif name == "long":
            if limit < LONG_MIN:
                out.skipped.append(f"long: max input {limit} tokens < {LONG_MIN}")
                continue
            lengths = [rng.randint(LONG_MIN, min(limit, LONG_MIN + 2000)) for _ in range(4)]
        else:
            raise UnknownPromptSetError(name, KNOWN_SETS)
        for n in lengths:
            out.prompts.append(window(min(n, limit)))
            out.sources.append(name)
    return out


def load_prompt_file(path: str | Path, *, model_dir: Path | None = None, limit: int | None = None) -> PromptSet:
    """A JSONL file, one object per line: ``{"prompt_token_ids": [...]}`` or ``{"prompt": "text"}``
    (text needs the model's tokenizer)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PromptFileError(str(p), None, "file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise PromptFileError(str(p), None, f"unreadable: {err}") from None
    tok = None
    out = PromptSet([], [])
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise PromptFileError(str(p), n, f"not JSON: {err.msg}") from None
        if isinstance(obj, dict) and isinstance(obj.get("prompt_token_ids"), list) and obj["prompt_token_ids"] \
                and all(isinstance(t, int) and t >= 0 for t in obj["prompt_token_ids"]):
            ids = obj["prompt_token_ids"]
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and obj["prompt"]:
            if tok is None:
                if model_dir is None or not (model_dir / "tokenizer.json").exists():
                    raise PromptFileError(str(p), n, "a text prompt needs the model's tokenizer")
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(str(model_dir))
            ids = tok(obj["prompt"])["input_ids"]
        else:
            raise PromptFileError(str(p), n, 'expected {"prompt_token_ids": [ints]} or {"prompt": "text"}')
        if limit is not None and len(ids) > limit:
            raise PromptFileError(str(p), n, f"prompt of {len(ids)} tokens exceeds the engine's limit of {limit}")
        out.prompts.append(ids)
        out.sources.append(f"file:{p.name}")
    if not out.prompts:
        raise PromptFileError(str(p), None, "no prompts")
    return out
