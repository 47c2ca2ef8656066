"""Write a file so that readers see either the old content or the new, never a part.

The text goes to a temporary file in the target's directory (same file system, so the rename
is atomic), is flushed and fsynced, and then replaces the target with ``os.replace``. If anything
fails before the rename, the temporary file is removed and the previous file is untouched.

The written file keeps the mode of the file it replaces; a new file gets the usual mode under the
umask (not ``mkstemp``'s 0600). A run killed between the two steps can leave a temporary file
behind; it is hidden and named ``.NAME.XXXX.tmp``, so it never passes for the output, and it is
not swept up later, since a concurrent writer of the same file may own it.

Every verb writes its files through :func:`atomic_write_text` or :func:`atomic_open`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from levers.errors import LeversError


@contextmanager
def atomic_open(
    path: str | os.PathLike[str],
    encoding: str = "utf-8",
    *,
    exclusive: bool = False,
    make_parents: bool = False,
) -> Iterator[IO[str]]:
    """Open a text file for writing that appears at ``path`` only if the block succeeds.

    With ``exclusive`` an existing file is an error (:class:`LeversError`) instead of being
    replaced; with ``make_parents`` missing directories are created.
    """
    target = Path(path)
    if exclusive and target.exists():
        raise LeversError(f"{target} already exists; choose another name or remove it first")
    directory = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise LeversError(f"cannot write {str(target)!r}: it is a directory; give a file name")
    try:
        if make_parents:
            directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise unwritable(target, exc) from None
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, _final_mode(target))
        if exclusive:
            try:
                os.link(tmp_name, target)  # unlike replace, fails if the file appeared meanwhile
            except FileExistsError:
                raise LeversError(f"{target} already exists; choose another name") from None
            os.unlink(tmp_name)
        else:
            os.replace(tmp_name, target)
    except BaseException as exc:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            raise unwritable(target, exc) from None
        raise
    _fsync_directory(directory)


def unwritable(target: Path, exc: OSError) -> LeversError:
    """The user's error for a path that cannot be written: which path, why, what to do."""
    cause = exc.strerror or str(exc)
    if isinstance(exc, FileNotFoundError) and target.parent.is_dir():
        # the directory is there and still takes no file: /proc, /sys and the like
        hint = (
            f"the directory {str(target.parent)!r} exists but takes no new files (a special "
            "file system such as /proc or /sys); choose a path in an ordinary directory"
        )
    elif isinstance(exc, FileNotFoundError):
        hint = f"create the directory {str(target.parent)!r} first or choose another path"
    elif isinstance(exc, (IsADirectoryError, NotADirectoryError)):
        hint = "give a file name in an existing directory"
    elif isinstance(exc, PermissionError):
        hint = "choose a path you may write"
    else:
        hint = "choose another path"
    return LeversError(f"cannot write {str(target)!r}: {cause}; {hint}")


def atomic_write_text(
    path: str | os.PathLike[str],
    text: str,
    encoding: str = "utf-8",
    *,
    exclusive: bool = False,
    make_parents: bool = False,
) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_open` for the options)."""
    with atomic_open(path, encoding=encoding, exclusive=exclusive, make_parents=make_parents) as f:
        f.write(text)


def _final_mode(target: Path) -> int:
    """Keep an existing file's mode; a new file gets the usual mode under the current umask."""
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; not possible on every platform, so best effort."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
