"""The input contract and its reader: every common encoding decodes upright and 8-bit, the resize policies keep what
they promise (a stored image written back as PNG comes back bit for bit), the one reader skips hidden and ._ files and
reads BOM, UTF-16 and TSV tables, and the contract objects come from the preprocessing record."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from tests.data.factories import PHOTO_KINDS, SUFFIX, sample_photos, write_photo
from trainlab.core.errors import DataError
from trainlab.data.images import decode_image
from trainlab.data.input_files import IMAGE_SUFFIXES, find_files, list_images, read_table
from trainlab.data.inputs import (
    ImageInput,
    SegmentationInput,
    TextInput,
    apply_policy,
    clean_text,
    load_contract,
    resize_mask,
)
from trainlab.data.prepared import load_meta, save_meta
from trainlab.data.preprocessing import (
    CROP,
    KEEP,
    STRETCH,
    ImagePolicy,
    image_record,
    save_preprocessing,
    text_record,
)
from trainlab.data.texts import clean_texts
from trainlab.data.tokenizer import Tokenizer


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


def test_pnm_files_are_images_for_prepare_and_predict_alike(tmp_path, photo):
    Image.fromarray(photo).save(tmp_path / "x.ppm")
    Image.fromarray(photo).convert("L").save(tmp_path / "y.pgm")
    assert {".ppm", ".pgm", ".pbm", ".pnm"} <= set(IMAGE_SUFFIXES)
    assert decode_image(tmp_path / "x.ppm").shape == (*photo.shape[:2], 3)
    assert decode_image(tmp_path / "y.pgm").shape == (*photo.shape[:2], 1)


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
    out = apply_policy(photo, ImagePolicy(3, 32, 32, CROP))
    assert out.shape == (3, 32, 32)
    # the centre crop of a wide image keeps its middle: compare with Pillow's own resize + crop
    expected = Image.fromarray(photo).resize((48, 32), Image.Resampling.BILINEAR).crop((8, 0, 40, 32))
    assert np.array_equal(out.transpose(1, 2, 0), np.asarray(expected))


def test_stretch_and_nearest_masks_keep_class_indices(photo):
    policy = ImagePolicy(1, 40, 50, STRETCH)
    assert apply_policy(photo, policy).shape == (1, 40, 50)
    mask = np.zeros(photo.shape[:2], np.uint8)
    mask[10:60, 20:90], mask[70:, 100:] = 3, 7
    resized = resize_mask(mask, policy)
    assert resized.shape == (40, 50) and set(np.unique(resized).tolist()) == {0, 3, 7}
    back = SegmentationInput(policy).mask_to_original(resized, *photo.shape[:2])
    assert back.shape == photo.shape[:2] and set(np.unique(back).tolist()) == {0, 3, 7}


def test_an_image_at_the_size_is_not_resampled():
    stored = np.random.default_rng(0).integers(0, 256, (3, 24, 24), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(stored.transpose(1, 2, 0)).save(buffer, "PNG")
    for resize in (KEEP, CROP, STRETCH):
        policy = ImagePolicy(3, 24, 24, resize)
        assert np.array_equal(ImageInput(policy)(buffer.getvalue()), stored)
        assert np.array_equal(SegmentationInput(policy)(buffer.getvalue()), stored)


def test_channels_follow_the_policy(photo):
    assert apply_policy(photo, ImagePolicy(1, 8, 8, STRETCH)).shape == (1, 8, 8)
    gray = np.asarray(Image.fromarray(photo).convert("L"))[:, :, None]
    out = apply_policy(gray, ImagePolicy(3, 8, 8, STRETCH))
    assert out.shape == (3, 8, 8) and np.array_equal(out[0], out[2])


def test_a_policy_record_from_another_normalisation_is_refused():
    record = ImagePolicy(3, 8, 8, CROP).to_dict()
    assert ImagePolicy.from_dict(record) == ImagePolicy(3, 8, 8, CROP)
    with pytest.raises(DataError, match="normalisation"):
        ImagePolicy.from_dict({**record, "mean": 0.45})


# --- the reader ------------------------------------------------------------------------------------------------------

def test_hidden_and_resource_fork_files_are_never_read_in_folders_or_trees(tmp_path):
    root = tmp_path / "in"
    for name in ("a.png", "b.JPG", "c.pgm", "._a.png", ".DS_Store", "notes.txt", "sub/d.webp", "sub/._d.webp",
                 ".hidden/e.png", "__MACOSX/._f.png"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    listing = list_images(root)
    assert [p.name for p in listing.files] == ["a.png", "b.JPG", "c.pgm"]
    assert sorted(p.name for p in listing.hidden) == [".DS_Store", "._a.png"]
    found = find_files([str(root), str(tmp_path / "nothing"), str(root / "._a.png")], IMAGE_SUFFIXES, "images")
    assert [p.relative_to(root).as_posix() for p in found.files] == ["a.png", "b.JPG", "c.pgm", "sub/d.webp",
                                                                        "._a.png"]  # a file named is read
    assert found.missing == [(str(tmp_path / "nothing"), f"{tmp_path / 'nothing'}: file not found")]
    assert len(found.skipped.hidden) == 4 and [p.name for p in found.skipped.not_images] == ["notes.txt"]
    globbed = find_files([str(root / "**" / "*.*")], IMAGE_SUFFIXES, "images")
    assert [p.name for p in globbed.files] == ["a.png", "b.JPG", "c.pgm", "d.webp"]


def test_tables_with_a_bom_utf16_or_tabs_read_alike(tmp_path):
    rows = "text,label\ncafé crème,a\nfine,b\n"
    (tmp_path / "plain.csv").write_text(rows, encoding="utf-8")
    (tmp_path / "bom.csv").write_bytes(rows.encode("utf-8-sig"))
    (tmp_path / "tabs.tsv").write_text(rows.replace(",", "\t"), encoding="utf-8")
    (tmp_path / "excel.tsv").write_bytes(rows.replace(",", "\t").encode("utf-16"))  # Excel's "Unicode text"
    tables = [read_table(tmp_path / name, ",") for name in ("plain.csv", "bom.csv", "tabs.tsv", "excel.tsv")]
    for table in tables:
        assert list(table.columns) == ["text", "label"] and list(table["text"]) == ["café crème", "fine"]
    (tmp_path / "latin1.csv").write_bytes("text\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.csv: not UTF-8 text"):
        read_table(tmp_path / "latin1.csv", ",")


# --- the contract objects --------------------------------------------------------------------------------------------

def test_text_cleaning_is_one_function_for_prepare_and_predict():
    with pytest.raises(DataError, match=r"row 2: empty text") as from_prepare:
        clean_texts(["ok", "  \t "], np.array([0, 1]), lambda i: f"row {i + 1}")
    with pytest.raises(DataError) as from_predict:
        clean_text("  \t ", "row 2")
    assert str(from_prepare.value) == str(from_predict.value)
    assert clean_text(clean_text(" a \n b ", "x"), "x") == "a b"


def test_contracts_come_from_the_record_and_make_what_prepare_stores(tmp_path, photo):
    policy = ImagePolicy(1, 16, 16, CROP)
    save_preprocessing(tmp_path / "cls", image_record("classifier", ["a", "b"], policy))
    save_preprocessing(tmp_path / "seg", image_record("segmenter", ["bg", "fg"], policy))
    assert load_contract(tmp_path / "cls") == ImageInput(policy) != load_contract(tmp_path / "seg")
    tokenizer = Tokenizer.fit(["I love this", "a sad day"], 50, 1, 6)
    tokenizer.save(tmp_path / "text" / "tokenizer.json")
    save_preprocessing(tmp_path / "text", text_record(["neg", "pos"], "tokenizer.json"))
    contract = load_contract(tmp_path / "text")
    assert isinstance(contract, TextInput) and contract == TextInput(tokenizer)
    tokens, _ = contract.encode(["I  love\tthis", "a sad day"])
    assert np.array_equal(contract(" I love   this "), tokens[0].numpy()) and tokens.dtype.is_floating_point is False
    record = json.loads((tmp_path / "text" / "preprocessing.json").read_text())
    record["text"]["max_length"] = 64  # a record from before the tokenizer file was the one place of max_length
    (tmp_path / "text" / "preprocessing.json").write_text(json.dumps(record))
    with pytest.raises(DataError, match="max_length 64 but the tokenizer says 6"):
        load_contract(tmp_path / "text")


def test_the_stored_size_is_read_from_the_record_once(tmp_path):
    folder = tmp_path / "prepared"
    save_preprocessing(folder, image_record("classifier", ["a"], ImagePolicy(3, 20, 30, CROP)))
    save_meta(folder, {"task": "classifier", "num_classes": 1})
    assert load_meta(folder) == {"task": "classifier", "num_classes": 1, "channels": 3, "height": 20, "width": 30}
    save_meta(folder, {"task": "classifier", "num_classes": 1, "channels": 1})  # a meta.json written before
    assert load_meta(folder)["channels"] == 1
