"""Raw image -> stored image: every common encoding decodes upright and 8-bit, the resize policies keep what they
promise, and a stored image written back as PNG comes back bit for bit."""

import io

import numpy as np
import pytest
from PIL import Image

from tests.data.factories import PHOTO_KINDS, SUFFIX, sample_photos, write_photo
from trainlab.core.errors import DataError
from trainlab.data.transforms import (
    CROP,
    KEEP,
    STRETCH,
    ImagePolicy,
    apply_policy,
    decode_image,
    image_input,
    resize_mask,
)


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return sample_photos()["china"][100:220, 200:380]  # 120 x 180, not square


# how close each encoding comes back (mean absolute difference, 0-255): lossless ones exactly
TOLERANCE = {"jpeg": 6, "jpeg_exif_rotated": 6, "cmyk_jpeg": 6, "palette_png": 6, "rgba_png": 0, "png16_gray": 0,
             "tiff16": 0, "webp": 0, "gray_jpeg": 6, "bmp": 0}


@pytest.mark.parametrize("kind", PHOTO_KINDS)
def test_every_encoding_decodes_upright_to_the_picture(tmp_path, photo, kind):
    path = write_photo(tmp_path / f"x{SUFFIX[kind]}", photo, kind)
    pixels = decode_image(path)
    gray = kind in ("png16_gray", "gray_jpeg")
    assert pixels.dtype == np.uint8 and pixels.shape == (*photo.shape[:2], 1 if gray else 3)
    expected = np.asarray(Image.fromarray(photo).convert("L"))[:, :, None] if gray else photo
    assert np.abs(pixels.astype(int) - expected).mean() <= TOLERANCE[kind]


def test_bytes_decode_like_the_file(tmp_path, photo):
    path = write_photo(tmp_path / "x.webp", photo, "webp")
    assert np.array_equal(decode_image(path.read_bytes()), decode_image(path))


@pytest.mark.parametrize("data", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 40],
                         ids=["empty", "text", "broken_png"])
def test_unreadable_data_names_the_file(tmp_path, data):
    path = tmp_path / "broken.png"
    path.write_bytes(data)
    with pytest.raises(DataError, match=r"broken\.png: unreadable or corrupt image"):
        decode_image(path)


def test_truncated_jpeg_is_an_error(tmp_path, photo):
    path = write_photo(tmp_path / "cut.jpg", photo, "jpeg")
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    with pytest.raises(DataError, match=r"cut\.jpg: unreadable or corrupt image"):
        decode_image(path)


def test_shorter_side_and_centre_crop(photo):
    policy = ImagePolicy(3, 32, 32, CROP)
    out = apply_policy(photo, policy, "x")
    assert out.shape == (3, 32, 32)
    # the centre crop of a wide image keeps its middle: compare with Pillow's own resize + crop
    expected = Image.fromarray(photo).resize((48, 32), Image.Resampling.BILINEAR).crop((8, 0, 40, 32))
    assert np.array_equal(out.transpose(1, 2, 0), np.asarray(expected))


def test_stretch_and_nearest_masks_keep_class_indices(photo):
    policy = ImagePolicy(1, 40, 50, STRETCH)
    assert apply_policy(photo, policy, "x").shape == (1, 40, 50)
    mask = np.zeros(photo.shape[:2], np.uint8)
    mask[10:60, 20:90], mask[70:, 100:] = 3, 7
    resized = resize_mask(mask, policy)
    assert resized.shape == (40, 50) and set(np.unique(resized).tolist()) == {0, 3, 7}


def test_an_image_at_the_size_is_not_resampled(tmp_path):
    stored = np.random.default_rng(0).integers(0, 256, (3, 24, 24), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(stored.transpose(1, 2, 0)).save(buffer, "PNG")
    for resize in (KEEP, CROP, STRETCH):
        assert np.array_equal(image_input(buffer.getvalue(), ImagePolicy(3, 24, 24, resize)), stored)


def test_channels_follow_the_policy(photo):
    assert apply_policy(photo, ImagePolicy(1, 8, 8, STRETCH), "x").shape == (1, 8, 8)
    gray = np.asarray(Image.fromarray(photo).convert("L"))[:, :, None]
    out = apply_policy(gray, ImagePolicy(3, 8, 8, STRETCH), "x")
    assert out.shape == (3, 8, 8) and np.array_equal(out[0], out[2])


def test_a_policy_record_from_another_normalisation_is_refused():
    record = ImagePolicy(3, 8, 8, CROP).to_dict()
    assert ImagePolicy.from_dict(record) == ImagePolicy(3, 8, 8, CROP)
    with pytest.raises(DataError, match="normalisation"):
        ImagePolicy.from_dict({**record, "mean": 0.45})
