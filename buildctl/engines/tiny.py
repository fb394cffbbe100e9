"""The tiny Llama: a real model made locally and deterministically, with no hub download.

A byte-level BPE tokenizer is trained on ``engines/data/corpus.txt`` and padded with added
tokens up to the vocabulary size so every id decodes; a ~1M-parameter ``LlamaForCausalLM`` is
initialised from the seed and trained for ``train_steps`` AdamW steps on the same text, which
makes greedy decoding confident (random weights have near-tied logits, and greedy parity then
flips on ties). The result is a normal HF checkpoint directory (safetensors, config, tokenizer),
cached by its parameters so a second request is instant.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from buildctl.core.digest import digest_json, hex_of
from buildctl.engines.errors import ModelSourceError
from buildctl.engines.profile import TinyModel

CORPUS = Path(__file__).with_name("data") / "corpus.txt"
TINY_FORMAT = 1  # bump when the recipe below changes: it is part of the cache key

ARCH = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=3,
            tie_word_embeddings=False)
TRAIN = dict(lr=3e-3, batch=16, seq=128)
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def cache_root(cache_dir: str | Path) -> Path:
    """Where tiny models are cached under buildctl's cache directory (``Settings.cache_dir``)."""
    return Path(cache_dir) / "tiny"


def recipe_key(spec: TinyModel) -> str:
    corpus = CORPUS.read_bytes()
    return hex_of(digest_json({"format": TINY_FORMAT, "spec": spec.model_dump(mode="json"), "arch": ARCH,
                               "train": TRAIN, "corpus": corpus.decode()}))[:20]


def _train_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=ARCH["vocab_size"], special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(CORPUS)], trainer)
    missing = ARCH["vocab_size"] - tok.get_vocab_size()
    if missing > 0:
        tok.add_tokens([f"<extra_{i}>" for i in range(missing)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    fast.save_pretrained(out)
    return fast


def _build(spec: TinyModel, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer(out)
    torch.manual_seed(spec.seed)
    config = LlamaConfig(**ARCH, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    ids = torch.tensor(tokenizer(CORPUS.read_text())["input_ids"], dtype=torch.long)
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"])
    seq = min(TRAIN["seq"], len(ids) - 1)
    model.train()
    for _ in range(spec.train_steps):
        starts = torch.randint(0, len(ids) - seq - 1, (TRAIN["batch"],), generator=gen)
        batch = torch.stack([ids[s:s + seq + 1] for s in starts.tolist()])
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone()).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    (out / "buildctl-tiny.json").write_text(json.dumps({"spec": spec.model_dump(mode="json"), "format": TINY_FORMAT,
                                                        "final_loss": float(loss.detach()) if spec.train_steps else None}))


def make_tiny(spec: TinyModel, cache_dir: str | Path, dest: str | Path | None = None) -> Path:
    """The tiny checkpoint for ``spec``: from the cache under ``cache_dir``, else made and cached.
    Copied to ``dest`` if given."""
    cached = cache_root(cache_dir) / recipe_key(spec)
    if not (cached / "buildctl-tiny.json").exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.parent / f".{cached.name}-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            _build(spec, tmp)
            try:
                os.rename(tmp, cached)  # atomic; a concurrent maker may have won
            except OSError:
                if not (cached / "buildctl-tiny.json").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if dest is None:
        return cached
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise ModelSourceError(str(dest), "exists and is not empty")
    shutil.copytree(cached, dest, dirs_exist_ok=True)
    return dest
