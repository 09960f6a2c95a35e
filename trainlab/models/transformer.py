"""transformer: a Transformer encoder over token ids (token + position embeddings, pre-norm SDPA blocks, pooled
linear head)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.models.checkpointing import checkpoint_block
from trainlab.models.init import init_weights


class SelfAttention(nn.Module):
    """Multi-head self-attention over the keys allowed by a (N, L) boolean mask."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, keep, return_attention: bool = False):
        n, length, d = x.shape
        q, k, v = self.qkv(x).view(n, length, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        mask = keep[:, None, None, :]  # (N, 1, 1, L): True where a key may be attended to
        att = None
        # No dropout on the attention weights: on CPU it forces SDPA's math path and a bernoulli over
        # (N, heads, L, L) that cost ~20% of a step; the residual and MLP dropouts regularise instead.
        if return_attention:  # explicit weights, for heatmaps; training uses the fused kernel below
            att = (q @ k.transpose(-2, -1) * q.size(-1) ** -0.5).masked_fill(~mask, float("-inf")).softmax(-1)
            y = att @ v
        elif q.device.type == "cpu" and q.dtype != torch.float32:
            # On CPU the fused kernel is much slower in bf16/fp16 than in fp32 (one step of the default text
            # model: about 1.6x), so attention runs in fp32 there; the linear layers keep the autocast dtype.
            with torch.autocast("cpu", enabled=False):
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(q.dtype)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(n, length, d)), att


class Block(nn.Module):
    """Pre-norm Transformer encoder block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, dim_feedforward), nn.GELU(), nn.Linear(dim_feedforward, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, keep, return_attention: bool = False):
        y, att = self.attn(self.ln1(x), keep, return_attention)
        x = x + self.drop(y)
        x = x + self.drop(self.mlp(self.ln2(x)))
        return (x, att) if return_attention else x


class TextTransformer(nn.Module):
    """Token ids (N, L) -> logits (N, num_classes); pad tokens are masked out of attention and pooling."""

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0, d_model: int = 128,
                 n_heads: int = 4, n_layers: int = 2, dim_feedforward: int = 256, dropout: float = 0.1,
                 pooling: str = "mean", checkpointing: bool = False, embedding_dropout: float = 0.0):
        super().__init__()
        self.max_length, self.pad_id, self.pooling, self.checkpointing = max_length, pad_id, pooling, checkpointing
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_length, d_model)
        self.drop = nn.Dropout(dropout)
        # whole-word dropout: zeroes a word's embedding vector (not single features), so that the model cannot lean
        # on a few frequent words of a small corpus
        self.embedding_dropout = embedding_dropout
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dim_feedforward, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens, return_attention: bool = False):
        length = tokens.size(1)
        if length > self.max_length:
            raise ValueError(f"sequence length {length} is longer than the model's max_length {self.max_length}")
        real = tokens != self.pad_id
        keep = real | ~real.any(1, keepdim=True)  # all-pad rows attend to everything rather than nothing (NaN)
        words = self.tok_emb(tokens)
        if self.training and self.embedding_dropout:
            keep_word = torch.rand(words.shape[:2], device=words.device) >= self.embedding_dropout
            words = words * keep_word.unsqueeze(-1).to(words.dtype) / (1 - self.embedding_dropout)
        x = self.drop(words + self.pos_emb(torch.arange(length, device=tokens.device)))
        attentions = []
        for block in self.blocks:
            if return_attention:
                x, att = block(x, keep, return_attention=True)
                attentions.append(att)
            else:
                x = checkpoint_block(block, x, keep, enabled=self.checkpointing)
        x = self.norm(x)
        if self.pooling == "cls":  # the data puts [CLS] at position 0
            pooled = x[:, 0]
        else:
            weights = real.unsqueeze(-1).to(x.dtype)
            pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1)
        logits = self.head(pooled)
        return (logits, attentions) if return_attention else logits


def build(p, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0) -> TextTransformer:
    """The Transformer of text section `p` over token ids of at most `max_length` tokens."""
    sizes = {"vocab_size": vocab_size, "num_classes": num_classes, "max_length": max_length, "pad_id": pad_id}
    model = TextTransformer(vocab_size, num_classes, max_length, pad_id, p.d_model, p.n_heads, p.n_layers,
                            p.dim_feedforward, p.dropout, p.pooling, p.activation_checkpointing, p.embedding_dropout)
    init_weights(model, p.init)
    model.config = {
        "task": "text", "arch": "transformer_encoder", "d_model": p.d_model, "n_heads": p.n_heads,
        "n_layers": p.n_layers, "dim_feedforward": p.dim_feedforward, "dropout": p.dropout, "pooling": p.pooling,
        "embedding_dropout": p.embedding_dropout, **sizes,
    }
    return model
