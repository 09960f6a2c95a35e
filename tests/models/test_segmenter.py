"""Tests for the U-Net segmenter: shapes, no interpolation, depthwise option, checkpointing, config round trip."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from trainlab.core.config import SegmenterParams
from trainlab.models.init import count_parameters
from trainlab.models.segmenter import build_segmenter
from trainlab.tasks import build_from_config


@pytest.mark.parametrize("depth,size", [(1, (64, 64)), (3, (64, 64)), (3, (32, 48)), (3, (30, 45))])
def test_output_has_input_height_and_width(depth, size):
    model = build_segmenter(SegmenterParams(base_channels=4, depth=depth), num_classes=11, in_channels=1)
    assert model(torch.randn(2, 1, *size)).shape == (2, 11, *size)


def test_decoder_uses_transposed_convs_not_interpolation(monkeypatch):
    model = build_segmenter(SegmenterParams(base_channels=4, depth=3), num_classes=3, in_channels=3)
    assert not any(isinstance(m, torch.nn.Upsample) for m in model.modules())
    assert sum(isinstance(m, torch.nn.ConvTranspose2d) for m in model.modules()) == 3

    def refuse(*args, **kwargs):
        raise AssertionError("interpolate called")

    monkeypatch.setattr(F, "interpolate", refuse)
    model(torch.randn(2, 3, 64, 64)).sum().backward()


def test_depthwise_separable_reduces_parameters():
    plain = build_segmenter(SegmenterParams(base_channels=8), 11, 1)
    separable = build_segmenter(SegmenterParams(base_channels=8, depthwise_separable=True), 11, 1)
    assert count_parameters(separable)[0] < count_parameters(plain)[0] / 2
    assert separable(torch.randn(2, 1, 32, 32)).shape == (2, 11, 32, 32)
    assert any(m.groups > 1 for m in separable.modules() if isinstance(m, torch.nn.Conv2d))


@pytest.mark.parametrize("depthwise", [False, True])
def test_activation_checkpointing_matches_plain_training(depthwise):
    torch.manual_seed(0)
    plain = build_segmenter(SegmenterParams(base_channels=4, depthwise_separable=depthwise), 5, 1)
    ckpt = build_segmenter(
        SegmenterParams(base_channels=4, depthwise_separable=depthwise, activation_checkpointing=True), 5, 1
    )
    ckpt.load_state_dict(plain.state_dict())
    x, y = torch.randn(2, 1, 32, 32), torch.randint(0, 5, (2, 32, 32))
    results = []
    for model in (plain.train(), ckpt.train()):
        loss = F.cross_entropy(model(x), y, reduction="none").mean()
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=0)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    for (name, a), b in zip(plain.state_dict().items(), ckpt.state_dict().values()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=name)


def test_channels_last_bf16_autocast_step():
    model = build_segmenter(SegmenterParams(base_channels=4), 11, 1).to(memory_format=torch.channels_last)
    x = torch.randn(2, 1, 64, 64).to(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits.float(), torch.randint(0, 11, (2, 64, 64)))
    loss.backward()
    assert logits.shape == (2, 11, 64, 64) and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_build_from_config_round_trip():
    model = build_segmenter(SegmenterParams(base_channels=4, depth=2, depthwise_separable=True), 11, 3)
    rebuilt = build_from_config("segmenter", json.loads(json.dumps(model.config)))
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert rebuilt.config == model.config


def full_resolution_convs(model) -> tuple[list[int], list[int]]:
    """3x3 convs of each block at the input's resolution, and of the blocks below it (found on a 16x16 input)."""
    seen = []
    hooks = [block.register_forward_hook(lambda mod, inp, out, seen=seen: seen.append(
        (out.shape[-1], sum(isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3) for m in mod.modules()))))
        for block in [*model.encoder, *model.decoder]]
    model(torch.randn(1, 1, 16, 16))
    for hook in hooks:
        hook.remove()
    return [convs for width, convs in seen if width == 16], [convs for width, convs in seen if width < 16]


@pytest.mark.parametrize("convs", [1, 2])
def test_full_res_convs_sets_the_convs_of_the_full_resolution_blocks_only(convs):
    model = build_segmenter(SegmenterParams(base_channels=4, depth=2, full_res_convs=convs), 11, 1)
    full, lower = full_resolution_convs(model)
    assert full == [convs, convs] and lower == [2, 2, 2]  # encoder's first and decoder's last; the rest double
    assert model(torch.randn(2, 1, 24, 40)).shape == (2, 11, 24, 40)


def test_a_config_saved_before_full_res_convs_rebuilds_the_double_convs():
    light = build_segmenter(SegmenterParams(base_channels=4, depth=2, full_res_convs=1), 11, 1)
    assert build_from_config("segmenter", json.loads(json.dumps(light.config))).config["full_res_convs"] == 1
    older = {k: v for k, v in light.config.items() if k != "full_res_convs"}
    rebuilt = build_from_config("segmenter", older)
    assert rebuilt.config["full_res_convs"] == 2 and full_resolution_convs(rebuilt)[0] == [2, 2]
    assert count_parameters(rebuilt)[0] > count_parameters(light)[0]


def decoder_inputs(model) -> list[tuple[int, int]]:
    """(input channels, output width) of each decoder block's first conv, bottom to top."""
    return [(block[0].in_channels, block[0].out_channels) for block in model.decoder]


def test_skip_merge_add_adds_the_skips_below_full_resolution_and_concatenates_there(monkeypatch):
    added = build_segmenter(SegmenterParams(base_channels=4, depth=3, skip_merge="add"), 11, 1)
    assert decoder_inputs(added) == [(16, 16), (8, 8), (8, 4)]  # the full-resolution block sees skip + upsampled
    assert decoder_inputs(build_segmenter(SegmenterParams(base_channels=4, depth=3, skip_merge="concat"), 11, 1)) == [
        (32, 16), (16, 8), (8, 4)]
    assert added(torch.randn(2, 1, 24, 40)).shape == (2, 11, 24, 40)
    cats, torch_cat = [], torch.cat
    monkeypatch.setattr(torch, "cat", lambda tensors, *a, **k: cats.append(len(tensors)) or torch_cat(tensors, *a, **k))
    added(torch.randn(1, 1, 16, 16))
    assert cats == [2]  # one concatenation: the full-resolution skip


def test_a_config_saved_before_skip_merge_rebuilds_the_concatenating_decoder():
    added = build_segmenter(SegmenterParams(base_channels=4, depth=2, skip_merge="add"), 11, 1)
    assert build_from_config("segmenter", json.loads(json.dumps(added.config))).config["skip_merge"] == "add"
    older = build_from_config("segmenter", {k: v for k, v in added.config.items() if k != "skip_merge"})
    assert older.config["skip_merge"] == "concat" and decoder_inputs(older) == [(16, 8), (8, 4)]


def test_skip_merge_refuses_an_unknown_value():
    with pytest.raises(ValueError, match="skip_merge"):
        SegmenterParams(skip_merge="sum")
