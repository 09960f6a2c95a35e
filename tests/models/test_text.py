"""Tests for the Transformer text classifier: pooling, padding masks, attention weights, checkpointing."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from trainlab.core.config import TextParams
from trainlab.core.errors import CheckpointError
from trainlab.models.text import build_text_model
from trainlab.tasks import build_from_config

PAD, CLS, VOCAB, MAX_LEN = 0, 2, 50, 16


def tiny(**overrides):
    return TextParams(**{"arch": "transformer", "d_model": 16, "n_heads": 2, "n_layers": 2, "dim_feedforward": 32,
                         **overrides})


def batch():
    """Two sequences starting with [CLS], padded to length 10 (lengths 10 and 4)."""
    torch.manual_seed(0)
    tokens = torch.randint(3, VOCAB, (2, 10))
    tokens[:, 0] = CLS
    tokens[1, 4:] = PAD
    return tokens


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_logits_shape(pooling):
    model = build_text_model(tiny(pooling=pooling), VOCAB, num_classes=4, max_length=MAX_LEN)
    assert model(batch()).shape == (2, 4)
    assert model.head.in_features == 16 and model.head.out_features == 4


def test_mean_and_cls_pooling_differ_with_same_weights():
    mean = build_text_model(tiny(pooling="mean"), VOCAB, 4, MAX_LEN).eval()
    cls = build_text_model(tiny(pooling="cls"), VOCAB, 4, MAX_LEN).eval()
    cls.load_state_dict(mean.state_dict())
    assert not torch.allclose(mean(batch()), cls(batch()))


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_appended_padding_does_not_change_logits(pooling):
    model = build_text_model(tiny(pooling=pooling), VOCAB, 4, MAX_LEN).eval()
    tokens = batch()
    longer = torch.cat([tokens, torch.full((2, 6), PAD)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(longer), model(tokens), atol=1e-5, rtol=0)


def test_return_attention_matches_forward_and_rows_sum_to_one():
    model = build_text_model(tiny(), VOCAB, 4, MAX_LEN).eval()
    tokens = batch()
    with torch.no_grad():
        logits, attentions = model(tokens, return_attention=True)
        torch.testing.assert_close(logits, model(tokens), atol=1e-5, rtol=0)
    assert len(attentions) == 2
    for att in attentions:
        assert att.shape == (2, 2, 10, 10)
        torch.testing.assert_close(att.sum(-1), torch.ones(2, 2, 10))
        assert att[1, :, :, 4:].abs().max() == 0  # no attention to pad keys


def test_bf16_autocast_runs_attention_in_fp32_on_cpu():
    """Under CPU autocast the attention itself stays fp32 (faster there); its output keeps the autocast dtype."""
    model = build_text_model(tiny(), VOCAB, 4, MAX_LEN).eval()
    seen = []
    hook = model.blocks[0].attn.proj.register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
    real_sdpa = F.scaled_dot_product_attention
    dtypes = []

    def spy(q, *args, **kwargs):
        dtypes.append(q.dtype)
        return real_sdpa(q, *args, **kwargs)

    F.scaled_dot_product_attention = spy
    try:
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            fast = model(batch())
        explicit, _ = model(batch(), return_attention=True)
    finally:
        F.scaled_dot_product_attention = real_sdpa
        hook.remove()
    assert dtypes == [torch.float32, torch.float32] and seen[0] == torch.bfloat16
    torch.testing.assert_close(fast.float(), explicit.detach(), atol=0.05, rtol=0)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_all_padding_input_is_finite(pooling):
    model = build_text_model(tiny(pooling=pooling), VOCAB, 4, MAX_LEN)
    tokens = torch.cat([batch(), torch.full((1, 10), PAD)])
    logits = model(tokens)
    logits.sum().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    _, attentions = model.eval()(tokens, return_attention=True)
    assert all(torch.isfinite(a).all() for a in attentions)


def test_too_long_input_is_an_error():
    model = build_text_model(tiny(), VOCAB, 4, max_length=8)
    with pytest.raises(ValueError, match="max_length 8"):
        model(torch.ones(1, 9, dtype=torch.long))


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_activation_checkpointing_matches_plain_training(pooling):
    torch.manual_seed(0)
    plain = build_text_model(tiny(pooling=pooling, dropout=0.0), VOCAB, 4, MAX_LEN)
    ckpt = build_text_model(tiny(pooling=pooling, dropout=0.0, activation_checkpointing=True), VOCAB, 4, MAX_LEN)
    ckpt.load_state_dict(plain.state_dict())
    results = []
    for model in (plain.train(), ckpt.train()):
        loss = F.cross_entropy(model(batch()), torch.tensor([1, 3]))
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=0)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_build_from_config_round_trip():
    model = build_text_model(tiny(pooling="cls", init="normal"), VOCAB, 3, MAX_LEN, pad_id=1)
    rebuilt = build_from_config("text", json.loads(json.dumps(model.config)))
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert rebuilt.config == model.config and rebuilt.pad_id == 1 and rebuilt.pooling == "cls"


def test_build_from_config_rejects_bad_configs():
    model = build_text_model(tiny(), VOCAB, 3, MAX_LEN)
    with pytest.raises(ValueError, match="unknown task"):
        build_from_config("detector", model.config)
    with pytest.raises(CheckpointError, match="classifier"):
        build_from_config("classifier", model.config)
    with pytest.raises(CheckpointError):
        build_from_config("text", {**model.config, "n_heads": 3})
