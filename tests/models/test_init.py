"""Tests for weight init schemes and parameter counting."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainlab.core.config import SegmenterParams, TextParams
from trainlab.models.init import count_parameters, init_weights
from trainlab.models.segmenter import build_segmenter
from trainlab.models.text import build_text_model


def zoo():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Embedding(100, 32), nn.Conv2d(3, 32, 3), nn.BatchNorm2d(32), nn.GroupNorm(4, 32),
        nn.ConvTranspose2d(32, 8, 2), nn.LayerNorm(32), nn.Linear(32, 64), nn.Linear(256, 128),
    )


def randomise_norms(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
                m.weight.uniform_(2, 3)
                m.bias.uniform_(2, 3)
    return model


@pytest.mark.parametrize("scheme", ["kaiming", "xavier", "orthogonal", "normal"])
def test_schemes_zero_biases_and_reset_norms(scheme):
    model = init_weights(randomise_norms(zoo()), scheme)
    for m in model.modules():
        if getattr(m, "bias", None) is not None:
            assert m.bias.abs().max() == 0, m
        if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
            assert (m.weight == 1).all(), m
        elif isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear, nn.Embedding)):
            assert m.weight.std() > 0


def test_default_keeps_framework_init():
    model = randomise_norms(zoo())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    init_weights(model, "default")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_orthogonal_gives_orthonormal_columns():
    model = init_weights(zoo(), "orthogonal")
    w = model[6].weight  # 64 x 32: orthonormal columns
    torch.testing.assert_close(w.T @ w, torch.eye(32), atol=1e-5, rtol=0)
    w = model[7].weight  # 128 x 256: orthonormal rows
    torch.testing.assert_close(w @ w.T, torch.eye(128), atol=1e-5, rtol=0)


def test_normal_and_kaiming_scales():
    assert init_weights(zoo(), "normal")[7].weight.std().item() == pytest.approx(0.02, rel=0.05)
    conv = init_weights(nn.Conv2d(64, 128, 3), "kaiming")  # fan_out = 128 * 9
    assert conv.weight.std().item() == pytest.approx((2 / (128 * 9)) ** 0.5, rel=0.05)
    with pytest.raises(ValueError, match="unknown init scheme"):
        init_weights(zoo(), "he")


def test_builders_apply_the_init_scheme():
    text = build_text_model(TextParams(arch="transformer", d_model=16, n_heads=2, init="normal"), 100, 3, 8)
    assert text.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert text.head.bias.abs().max() == 0 and (text.norm.weight == 1).all()
    unet = build_segmenter(SegmenterParams(base_channels=4, init="xavier"), 3, 1)
    assert unet.head.bias.abs().max() == 0


def test_count_parameters_reports_total_and_trainable():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)
    assert count_parameters(model) == (15 + 8, 8)
