"""Files only the server's user may read, private from the moment they exist.

Writing first and chmod-ing after leaves a window in which the file has the umask's mode
(often world-readable); os.open with a mode creates it private.
"""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask, and an existing dir keeps its own
    except PermissionError:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"{path} must belong to the user Muster runs as (uid {os.getuid()}): "
                                   "it holds the database, keys and logs") from None
    return path


def write_private(path: Path, text: str) -> None:
    """Create (or replace) `path` with mode 0600 and `text`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_or_create_private(path: Path, make) -> str:
    """The content of `path`, creating it (0600) with `make()` if it does not exist yet.

    Web, worker and beat may start at once: the file appears whole or not at all (written aside,
    then hard-linked into place, which fails if another process got there first), so no two
    processes ever use two different generated keys.
    """
    if not path.exists():
        aside = path.with_name(f".{path.name}.{os.getpid()}")
        write_private(aside, make())
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(aside)
    return path.read_text().strip()
