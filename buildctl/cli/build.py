"""Build commands: build (with the build cache) and model make-tiny."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from buildctl.cli._common import emit_json, context, out, settings, want_json

model_app = typer.Typer(help="Model checkpoints.", no_args_is_help=True)


def build_cmd(
    ctx: typer.Context,
    profile: Path = typer.Argument(..., help="Build profile YAML."),
    model: Optional[str] = typer.Option(None, "--model", help="Checkpoint directory or s3:// URI (default: the profile's)."),
    target_compat_key: Optional[str] = typer.Option(None, "--target-compat-key", help="Refuse unless this host has this compat key."),
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="Where builds run (default: the temp dir)."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Build, publish and print an artifact id; a build key that already has an artifact is a cache hit."""
    from buildctl.engines.profile import load_profile
    from buildctl.steps.build import build

    prof = load_profile(profile)
    quiet = want_json(ctx, json_out)
    say = (lambda m: None) if quiet else (lambda m: typer.echo(f"[build] {m}", err=True))
    res = build(context(ctx), prof, model=model, target_compat_key=target_compat_key,
                workdir=workdir, say=say)
    if quiet:
        emit_json(res.to_json())
        return
    out().print(res.artifact_id)
    if res.cache_hit:
        typer.echo(f"cache hit: build key {res.build_key} already has this artifact; no builder ran "
                   f"({res.total_s:.2f}s)", err=True)
    else:
        typer.echo(f"built in {res.build_s:.1f}s, published in {res.publish_s:.1f}s"
                   + (" (adopted a concurrent build's artifact)" if res.adopted else ""), err=True)


@model_app.command("make-tiny")
def make_tiny_cmd(
    ctx: typer.Context,
    dest: Path = typer.Argument(..., help="Directory to write the HF checkpoint to (must be empty or absent)."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1, help="Seed for weights and training order."),
    train_steps: int = typer.Option(100, "--train-steps", min=0, max=100_000, help="AdamW steps on the shipped corpus."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Create the tiny Llama locally and deterministically (no download); cached by its parameters."""
    from buildctl.engines.profile import TinyModel
    from buildctl.engines.tiny import make_tiny
    from buildctl.artifact_store.manifest import tree_digest

    path = make_tiny(TinyModel(seed=seed, train_steps=train_steps), settings(ctx).cache_dir, dest)
    digest = tree_digest(path)
    if want_json(ctx, json_out):
        emit_json({"path": str(path), "model_digest": digest})
    else:
        out().print(f"{path}  {digest}")


class _FastTokenizer:
    """A tokenizer.json read by the ``tokenizers`` library alone: importing transformers' AutoTokenizer
    costs seconds per command (it pulls in torch.distributed and the auto classes), which a node's
    smoke check pays on every pull."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def __call__(self, text: str) -> dict:
        return {"input_ids": self._tok.encode(text).ids}

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def _load_tokenizer(directory: Path):
    """The directory's tokenizer. A ``tokenizer.json`` whose config asks for no special tokens on top
    (no ``add_bos_token``/``add_eos_token``, which transformers applies itself) is read by the
    ``tokenizers`` library directly, with the same ids; anything else goes through AutoTokenizer."""
    import json

    config = directory / "tokenizer_config.json"
    try:
        extra = json.loads(config.read_text()) if config.is_file() else {}
    except (OSError, ValueError):
        extra = {"unreadable": True}
    if (directory / "tokenizer.json").is_file() and not {"add_bos_token", "add_eos_token", "unreadable"} & set(extra):
        return _FastTokenizer(directory / "tokenizer.json")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def generate_cmd(
    ctx: typer.Context,
    engine: Path = typer.Argument(..., help="An engine directory, e.g. DIR/current after a pull."),
    prompt_ids: Optional[str] = typer.Option(None, "--prompt-ids", help="Comma-separated token ids."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Text; needs --tokenizer."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="HF tokenizer directory to encode/decode text."),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1, max=2**24, help="Tokens to generate."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Generate greedily from an installed engine (a smoke test on a node)."""
    from buildctl.core.errors import BadInputError
    from buildctl.steps.host import load_engine

    tok = _load_tokenizer(tokenizer) if tokenizer is not None else None
    if prompt_ids:
        try:
            ids = [int(x) for x in prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise BadInputError(f"--prompt-ids {prompt_ids!r}: expected comma-separated integers") from None
    elif prompt is not None and tok is not None:
        ids = tok(prompt)["input_ids"]
    else:
        raise BadInputError("give --prompt-ids, or --prompt with --tokenizer")
    runner = load_engine(settings(ctx), engine)
    try:
        gen = runner.generate([ids], max_tokens, top_logprobs=1)[0]
    finally:
        runner.close()
    text = tok.decode(gen.token_ids) if tok is not None else None
    if want_json(ctx, json_out):
        emit_json({"prompt_ids": ids, "token_ids": gen.token_ids, "text": text})
    else:
        out().print(f"token ids: {gen.token_ids}")
        if text is not None:
            out().print(f"text: {text!r}")
