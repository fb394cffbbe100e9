"""The two graphs of a Llama with a KV cache, as plain torch modules that ``torch.export`` takes.

:class:`Prefill` runs right-padded prompts ``ids [n, S]`` and returns the log-probabilities of
the token after each row's last prompt position (``last [n]``) and the keys and values of every
position, ``[layers, 2, n, kv_heads, S, head_dim]``. :class:`Decode` runs one new token per live
request at its own position against the runner's cache and returns its log-probabilities and its
keys and values ``[layers, 2, B, kv_heads, head_dim]``; the runner writes them into the cache
(:mod:`buildctl.engines.batching`). Both share the checkpoint's weights (:class:`LlamaWeights`).

The arithmetic is Hugging Face's ``LlamaForCausalLM`` (RMSNorm in fp32, rotary embeddings with
``rotate_half``, grouped-query attention, SiLU-gated MLP), written out so that the cache stays
outside the graph: a decode step is a function of its inputs only. What the export needs:

* the attended length comes from the mask, never from position values (that would be a
  data-dependent shape);
* attention in a decode step is a multiply-and-sum over the query heads of each KV head, which
  beat tiny batched matmuls on CPU;
* only the Llama family (``LlamaForCausalLM``, no rope scaling, no biases) is supported:
  :func:`check_supported` names what is not.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


def check_supported(config: dict[str, Any]) -> list[str]:
    """Why a checkpoint's ``config.json`` is not a Llama these graphs compute exactly (empty: it is)."""
    problems = []
    archs = config.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        problems.append(f"architecture {'/'.join(archs) or 'unknown'} is not one of {', '.join(SUPPORTED_ARCHITECTURES)}")
    rope = config.get("rope_scaling") or {}
    params = config.get("rope_parameters") or {}
    kind = rope.get("rope_type") or rope.get("type") or params.get("rope_type") or "default"
    if kind != "default":
        problems.append(f"rope scaling {kind!r} is not supported")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            problems.append(f"{flag} is not supported")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config.get('hidden_act')!r} is not supported")
    return problems


def rope_theta(config: dict[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


class LlamaWeights(nn.Module):
    """The checkpoint's tensors, under the names of the graphs (shared by :class:`Prefill` and :class:`Decode`)."""

    def __init__(self, model: nn.Module, config: dict[str, Any]) -> None:
        super().__init__()
        inner = model.model
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or config["hidden_size"] // self.heads)
        self.layers = len(inner.layers)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.register_buffer("embed", inner.embed_tokens.weight.detach())
        self.register_buffer("norm", inner.norm.weight.detach())
        self.register_buffer("lm_head", model.lm_head.weight.detach())
        self.blocks = nn.ModuleList()
        for layer in inner.layers:
            block = nn.Module()
            attn, mlp = layer.self_attn, layer.mlp
            block.register_buffer("ln1", layer.input_layernorm.weight.detach())
            block.register_buffer("ln2", layer.post_attention_layernorm.weight.detach())
            block.register_buffer("wq", attn.q_proj.weight.detach())
            block.register_buffer("wk", attn.k_proj.weight.detach())
            block.register_buffer("wv", attn.v_proj.weight.detach())
            block.register_buffer("wo", attn.o_proj.weight.detach())
            block.register_buffer("gate", mlp.gate_proj.weight.detach())
            block.register_buffer("up", mlp.up_proj.weight.detach())
            block.register_buffer("down", mlp.down_proj.weight.detach())
            self.blocks.append(block)
        inv = 1.0 / (rope_theta(config) ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.register_buffer("inv_freq", inv)

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for ``positions`` [...]: [..., head_dim]."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def mlp(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        h = self.rms(x, block.ln2)
        return x + nn.functional.linear(nn.functional.silu(nn.functional.linear(h, block.gate))
                                        * nn.functional.linear(h, block.up), block.down)

    def logprobs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(nn.functional.linear(self.rms(x, self.norm), self.lm_head).float(), dim=-1)


class Prefill(nn.Module):
    """``(ids [n, S], last [n]) -> (logprobs [n, V], kv [layers, 2, n, kv_heads, S, head_dim])``."""

    def __init__(self, w: LlamaWeights) -> None:
        super().__init__()
        self.w = w

    def forward(self, ids: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.w
        n, s = ids.shape
        group = w.heads // w.kv_heads
        x = nn.functional.embedding(ids, w.embed)
        cos, sin = w.rotary(torch.arange(s, device=ids.device))  # [S, D]
        causal = torch.full((s, s), float("-inf"), device=ids.device).triu(1)
        kvs = []
        for block in w.blocks:
            h = w.rms(x, block.ln1)
            q = nn.functional.linear(h, block.wq).view(n, s, w.heads, w.head_dim).transpose(1, 2)
            k = nn.functional.linear(h, block.wk).view(n, s, w.kv_heads, w.head_dim).transpose(1, 2)
            v = nn.functional.linear(h, block.wv).view(n, s, w.kv_heads, w.head_dim).transpose(1, 2)
            q, k = w.rotate(q, cos, sin), w.rotate(k, cos, sin)
            kvs.append(torch.stack((k, v)))
            kk = k.repeat_interleave(group, dim=1)
            vv = v.repeat_interleave(group, dim=1)
            scores = torch.matmul(q, kk.transpose(-1, -2)) * (w.head_dim ** -0.5) + causal
            attn = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), vv)
            x = x + nn.functional.linear(attn.transpose(1, 2).reshape(n, s, w.heads * w.head_dim), block.wo)
            x = w.mlp(block, x)
        rows = x[torch.arange(n, device=ids.device), last]  # each row's last prompt position
        return w.logprobs(rows), torch.stack(kvs)


class Decode(nn.Module):
    """``(tokens [B], positions [B], mask [B, T], cache [layers, 2, B, kv_heads, T, head_dim])
    -> (logprobs [B, V], new [layers, 2, B, kv_heads, head_dim])``."""

    def __init__(self, w: LlamaWeights) -> None:
        super().__init__()
        self.w = w

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.w
        b = tokens.shape[0]
        group = w.heads // w.kv_heads
        scale = w.head_dim ** -0.5
        x = nn.functional.embedding(tokens, w.embed)  # [B, hidden]
        cos, sin = w.rotary(positions)  # [B, D]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        news = []
        for layer, block in enumerate(w.blocks):
            h = w.rms(x, block.ln1)
            q = w.rotate(nn.functional.linear(h, block.wq).view(b, w.heads, w.head_dim), cos, sin)
            k = w.rotate(nn.functional.linear(h, block.wk).view(b, w.kv_heads, w.head_dim), cos, sin)
            v = nn.functional.linear(h, block.wv).view(b, w.kv_heads, w.head_dim)
            news.append(torch.stack((k, v)))
            q = q.view(b, w.kv_heads, group, 1, w.head_dim)
            past_k, past_v = cache[layer, 0], cache[layer, 1]  # [B, kv_heads, T, D]
            past = (q * past_k.unsqueeze(2)).sum(-1) * scale + mask.view(b, 1, 1, -1)  # [B, kv, group, T]
            own = (q.squeeze(3) * k.unsqueeze(2)).sum(-1, keepdim=True) * scale  # [B, kv, group, 1]
            p = torch.softmax(torch.cat((past, own), dim=-1).float(), dim=-1).to(q.dtype)
            attn = (p[..., :-1].unsqueeze(-1) * past_v.unsqueeze(2)).sum(-2) + p[..., -1:] * v.unsqueeze(2)
            x = x + nn.functional.linear(attn.reshape(b, w.heads * w.head_dim), block.wo)
            x = w.mlp(block, x)
        return w.logprobs(x), torch.stack(news)


class EagerKVModel:
    """The two graphs run eagerly: the reference the compiled packages are checked against, and
    what the tests drive the batcher with."""

    def __init__(self, model_dir: str, dtype: str = "float32") -> None:
        import json
        from pathlib import Path

        from transformers import AutoModelForCausalLM

        config = json.loads((Path(model_dir) / "config.json").read_text())
        problems = check_supported(config)
        if problems:
            from buildctl.engines.errors import EngineLoadError

            raise EngineLoadError(str(model_dir), "; ".join(problems))
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        self.weights = LlamaWeights(hf, config).eval()
        self.layers, self.kv_heads, self.head_dim = self.weights.layers, self.weights.kv_heads, self.weights.head_dim
        self._prefill = Prefill(self.weights).eval()
        self._decode = Decode(self.weights).eval()

    def prefill(self, ids: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._prefill(ids, last)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
               cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._decode(tokens, positions, mask, cache)
