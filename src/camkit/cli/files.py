"""The image files of a command line: files as given, folders' images, what was left out and why."""

from __future__ import annotations

import errno
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from camkit.errors import ArgumentError
from camkit.io import IMAGE_SUFFIXES, READ_ERRORS

SHOWN_SKIPS = 10  # names listed in the summary; the rest are counted
SUFFIXES_SHOWN = ", ".join(sorted(suffix.lstrip(".") for suffix in IMAGE_SUFFIXES))


@dataclass
class FoundImages:
    """The images to do, a folder's ``skipped`` files and ``notes`` on animated GIFs."""

    paths: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[tuple[Path, str]] = field(default_factory=list)

    def report(self) -> None:
        """What was skipped and why, and the notes, on stderr."""
        if self.skipped:
            listed = ", ".join(f"{p.name} ({why})" for p, why in self.skipped[:SHOWN_SKIPS])
            more = len(self.skipped) - SHOWN_SKIPS
            listed += f", and {more} more" if more > 0 else ""
            print(f"camkit: skipped {len(self.skipped)} file(s): {listed}", file=sys.stderr)
        for path, note in self.notes:
            print(f"camkit: note: {path}: {note}", file=sys.stderr)


def why_not(entry: Path) -> str | None:
    """Why a folder's entry is not one of its images (None when it is one)."""
    if entry.name.startswith("."):
        return "hidden file"
    try:
        entry.stat()
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a symlink loop"
        if entry.is_symlink():
            return "a dangling symlink"
        return f"cannot be read: {error.strerror or error}"
    if entry.is_dir():
        return "a folder: subfolders are not searched"
    if not entry.is_file():
        return "not a regular file"
    if entry.suffix.lower() not in IMAGE_SUFFIXES:
        return f"not an image file name ({entry.suffix or 'no suffix'})"
    return None


def frames(path: Path) -> int:
    """How many frames an image file holds (1 when it cannot be told)."""
    try:
        with Image.open(path) as image:
            return int(getattr(image, "n_frames", 1))
    except READ_ERRORS:
        return 1


def find_images(paths: Sequence[str]) -> FoundImages:
    """Files as given, and each folder's image files (not recursive, sorted), the rest in
    ``skipped``; an animated GIF is its first frame (a note says so). A missing path or a folder
    without images: :class:`~camkit.errors.ArgumentError`."""
    found = FoundImages()
    for given in paths:
        path = Path(given)
        if path.is_dir():
            reasons = [(entry, why_not(entry)) for entry in sorted(path.iterdir())]
            inside = [entry for entry, reason in reasons if reason is None]
            found.skipped += [(entry, reason) for entry, reason in reasons if reason is not None]
            if not inside:
                raise ArgumentError(f"no image files ({SUFFIXES_SHOWN}) in directory {given}")
            found.paths.extend(inside)
        elif path.exists():
            found.paths.append(path)
        else:
            raise ArgumentError(f"no such file or directory: {given}")
    for path in found.paths:
        if path.suffix.lower() == ".gif" and (count := frames(path)) > 1:
            found.notes.append(
                (path, f"an animated GIF of {count} frames: only its first frame is explained")
            )
    return found
