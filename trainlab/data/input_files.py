"""The one reader of raw input files, for prepare and predict alike: which files are images (by suffix), which are
never read (hidden files such as .DS_Store and macOS's ``._x.jpg`` resource forks, and whatever is in hidden
folders), folders and globs expanded in a stable order, and CSV/TSV tables read through pandas as strings (UTF-8 with
or without a byte-order mark, or UTF-16 with one; a ``.tsv`` file is tab-separated whatever the delimiter)."""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainlab.core.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".gif", ".ppm", ".pgm", ".pbm", ".pnm")
IMAGE_KINDS = "PNG, JPEG, WebP, TIFF, BMP, GIF or PNM"
TABLE_SUFFIXES = (".csv", ".tsv")
TAB_SUFFIX = ".tsv"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def is_hidden(name: str) -> bool:
    """A name never read as data: a leading dot (.DS_Store, ._x.jpg, .git)."""
    return name.startswith(".")


@dataclass
class FolderListing:
    """The image files of a folder (sorted by name) and what was left out: hidden files, other files."""

    files: list[Path] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)
    not_images: list[Path] = field(default_factory=list)

    def sort_in(self, path: Path, suffixes: tuple[str, ...]) -> None:
        """File `path` under hidden (its name), files (one of `suffixes`) or not_images."""
        if is_hidden(path.name):
            self.hidden.append(path)
        else:
            (self.files if path.suffix.lower() in suffixes else self.not_images).append(path)

    def add(self, other: FolderListing) -> None:
        self.files += other.files
        self.hidden += other.hidden
        self.not_images += other.not_images


def list_images(folder: Path, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> FolderListing:
    """The files directly in `folder`: files of these suffixes; hidden files and files of other suffixes are listed
    apart, to be counted, never read."""
    listing = FolderListing()
    for path in sorted(folder.iterdir()):
        if not path.is_file():
            continue
        if is_hidden(path.name):
            listing.hidden.append(path)
        else:
            (listing.files if path.suffix.lower() in suffixes else listing.not_images).append(path)
    return listing


def list_tree(folder: Path, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> FolderListing:
    """The files under `folder`, recursively, sorted by path: as list_images, and nothing under a hidden folder."""
    listing = FolderListing()
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and not any(is_hidden(p) for p in parts[:-1]):
            listing.sort_in(path, suffixes)
    return listing


def require_folder(folder: Path, what: str) -> Path:
    if not folder.exists():
        raise DataError(f"{folder}: {what} folder not found")
    if not folder.is_dir():
        raise DataError(f"{folder}: expected a folder ({what}), found a file")
    return folder


@dataclass
class FoundFiles:
    """Files named on a command line, in order, with the names outputs give them; the arguments that named none
    (with why); the files left out of folders and globs (hidden, other suffixes)."""

    files: list[Path] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)  # (argument, message)
    skipped: FolderListing = field(default_factory=FolderListing)


def find_files(args: list[str], suffixes: tuple[str, ...], what: str) -> FoundFiles:
    """Files, folders and globs in the order given: a file as named; a folder's files of these suffixes, recursively,
    sorted (what list_tree leaves out is skipped); a glob's matches filtered the same way. An argument that names no
    such file is `missing`, with a message naming it and `what` was looked for ("image files (PNG, ...)")."""
    found = FoundFiles()
    for arg in args:
        path = Path(arg)
        if path.is_file():
            found.files.append(path)
            found.names.append(arg)
            continue
        if path.is_dir():
            listing, none = list_tree(path, suffixes), f"{arg}: no {what} in this folder"
        elif glob.has_magic(arg):
            listing, none = matches(arg, suffixes), f"{arg}: none of the {what} matches this pattern"
        else:
            found.missing.append((arg, f"{arg}: file not found"))
            continue
        found.skipped.add(FolderListing([], listing.hidden, listing.not_images))
        if not listing.files:
            found.missing.append((arg, none))
        found.files += listing.files
        found.names += [str(file) for file in listing.files]
    return found


def matches(pattern: str, suffixes: tuple[str, ...]) -> FolderListing:
    listing = FolderListing()
    for path in sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file()):
        listing.sort_in(path, suffixes)
    return listing


# --- tables ----------------------------------------------------------------------------------------------------------

def table_delimiter(path: Path, delimiter: str) -> str:
    """The delimiter a table is read with: a tab for a .tsv file, else `delimiter` (data.text.delimiter)."""
    return "\t" if path.suffix.lower() == TAB_SUFFIX else delimiter


def table_encoding(path: Path) -> str:
    """UTF-16 when the file starts with its byte-order mark, else UTF-8 (a UTF-8 byte-order mark is dropped)."""
    with open(path, "rb") as f:
        return "utf-16" if f.read(2) in UTF16_BOMS else "utf-8-sig"


def read_table(path: Path, delimiter: str) -> pd.DataFrame:
    """A CSV/TSV with a header row, every cell a string (empty cells ""), read with table_delimiter; a missing or
    unreadable file is a DataError naming the path."""
    import pandas as pd

    sep = table_delimiter(path, delimiter)
    try:
        return pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, encoding=table_encoding(path))
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: expected a CSV/TSV file, found a folder") from None
    except UnicodeError as exc:
        where = f" at byte {exc.start}" if isinstance(exc, UnicodeDecodeError) else ""
        raise DataError(f"{path}: not UTF-8 text ({getattr(exc, 'reason', exc)}{where}); save it as UTF-8") from None
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the file is empty (expected a header row and data rows)") from None
    except pd.errors.ParserError as exc:
        raise DataError(f"{path}: not a valid delimited file with delimiter {sep!r}: {exc}") from None


def require_column(table: pd.DataFrame, column: str, path: Path, key: str) -> None:
    """A DataError naming the file, the setting that chose `column` and the columns there are, if it is not there."""
    if column not in table.columns:
        columns = ", ".join(map(str, table.columns))
        raise DataError(f"{path}: column {column!r} not found ({key}); the columns are: {columns}")
