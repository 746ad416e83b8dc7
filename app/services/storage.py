"""The shared storage root: the one place the server reads, lists and deletes files, never outside it."""

from __future__ import annotations

import os
import shutil
import stat
from datetime import datetime, timezone
from pathlib import Path

from app.core.errors import PathNotFound, PathOutsideRoot, PathTooLong
from app.schemas.files import DiskOut, EntryOut

# A folder's size counts at most this many entries below it, so a huge datasets/ tree cannot stall a page.
SIZE_SCAN_LIMIT = 20_000
# What Linux file systems take: bytes of one name (NAME_MAX), and of a whole path given to a system call (PATH_MAX).
NAME_MAX = 255
PATH_MAX = 4096


def resolve_inside(root: Path, relative: str, *, field: str = "path") -> Path:
    """The real path `relative` names below `root`; raises PathOutsideRoot for any way out of it.

    Refused: absolute paths, `..` segments, NUL bytes, and symbolic links (anywhere along the path) that resolve
    outside the root. The server decodes %2F before routing, so an encoded slash arrives here as a real one.
    A path the file system would refuse as too long is PathTooLong, naming `field`, the parameter it came in.
    """
    if "\0" in relative or "\\" in relative or not _encodable(relative):
        raise PathOutsideRoot(f"{relative!r}: NUL bytes, backslashes and lone surrogates are not allowed in paths")
    candidate = Path(relative)
    if candidate.is_absolute():
        raise PathOutsideRoot(f"{relative!r}: absolute paths are not allowed; give a path inside the shared folder")
    if ".." in candidate.parts:
        raise PathOutsideRoot(f"{relative!r}: '..' is not allowed in paths")
    real_root = root.resolve()
    _check_length(real_root, relative, field=field)
    resolved = _resolved(real_root / candidate)
    if resolved is None:
        raise PathNotFound(f"{relative!r} is a symbolic link that leads round in a circle")
    if not resolved.is_relative_to(real_root):
        raise PathOutsideRoot(f"{relative!r} leads outside the shared folder (through a symbolic link)")
    return resolved


def _resolved(path: Path) -> Path | None:
    """The real path, or None where symbolic links lead round in a circle (Python raises RuntimeError or OSError)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return None


def _encodable(relative: str) -> bool:
    """Whether the file system can be given this name at all (a lone surrogate, from JSON's \\ud800, cannot)."""
    try:
        os.fsencode(relative)
    except UnicodeEncodeError:
        return False
    return True


def _check_length(real_root: Path, relative: str, *, field: str) -> None:
    """PathTooLong when a name in the path, or the whole path below the root, is longer than file systems take."""
    for name in relative.split("/"):
        size = len(os.fsencode(name))
        if size > NAME_MAX:
            raise PathTooLong(field, f"{field}: the name {name[:20]!r}... is {size} bytes long; a file or folder "
                                     f"name is at most {NAME_MAX} bytes")  # fmt: skip
    size = len(os.fsencode(real_root / relative))
    if size >= PATH_MAX:
        raise PathTooLong(field, f"{field}: the path is {size} bytes long with the shared folder's; "
                                 f"paths must be shorter than {PATH_MAX} bytes")  # fmt: skip


def existing(root: Path, relative: str, *, field: str = "path") -> Path:
    """Like resolve_inside, and the path must exist."""
    path = resolve_inside(root, relative, field=field)
    if not path.exists():
        raise PathNotFound(f"{relative!r} does not exist in the shared folder")
    return path


def relative_name(root: Path, path: Path) -> str:
    """`path` relative to the root, "/"-separated; "" for the root itself."""
    relative = path.relative_to(root.resolve()).as_posix()
    return "" if relative == "." else relative


def list_folder(root: Path, relative: str) -> list[EntryOut]:
    """The folder's entries, folders first, each with its size and time; links that leave the root are left out."""
    folder = existing(root, relative)
    if not folder.is_dir():
        raise PathNotFound(f"{relative!r} is a file, not a folder")
    real_root, prefix = root.resolve(), relative_name(root, folder)
    entries = []
    with os.scandir(folder) as items:
        for item in items:
            # Only a link can lead out of the folder; resolving every entry would cost a realpath each.
            if item.is_symlink():
                target = _resolved(Path(item.path))
                if target is None or not target.is_relative_to(real_root):
                    continue  # out of the root, or round in a circle
            try:
                info = item.stat()
            except OSError:
                continue  # a dangling link
            is_dir = stat.S_ISDIR(info.st_mode)
            size, complete = folder_size(Path(item.path)) if is_dir else (info.st_size, True)
            entries.append(EntryOut(name=item.name, path=f"{prefix}/{item.name}" if prefix else item.name,
                                    is_dir=is_dir, size=size, size_complete=complete,
                                    modified=datetime.fromtimestamp(info.st_mtime, timezone.utc)))  # fmt: skip
    return sorted(entries, key=lambda e: (not e.is_dir, e.name))


def folder_size(folder: Path) -> tuple[int, bool]:
    """Bytes of the files below `folder` (links not followed), and whether every entry was counted."""
    total, seen, pending = 0, 0, [folder]
    while pending:
        for item in os.scandir(pending.pop()):
            seen += 1
            if seen > SIZE_SCAN_LIMIT:
                return total, False
            if item.is_dir(follow_symlinks=False):
                pending.append(Path(item.path))
            elif item.is_file(follow_symlinks=False):
                total += item.stat(follow_symlinks=False).st_size
    return total, True


def disk_usage(root: Path) -> DiskOut:
    usage = shutil.disk_usage(root)
    return DiskOut(total=usage.total, used=usage.used, free=usage.free)
