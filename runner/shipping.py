"""The runner as one file: a zipapp of this package, built the same byte for byte every time.

The server uploads it to each host and compares checksums to decide whether to upload again
(backends/ssh/runner_host.py), so the archive depends on the sources only: entries sorted, one
fixed timestamp and mode, stored uncompressed (no dependence on the zlib version). This module is
the server's and stays out of the archive.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_LEFT_OUT = {"shipping.py"}
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold
_MAIN = b"import sys\n\nfrom runner.cli import main\n\nsys.exit(main())\n"


def sources(package: Path = PACKAGE) -> list[tuple[str, bytes]]:
    """(name in the archive, content) of every module the runner needs, sorted by name."""
    found = [(f"runner/{path.name}", path.read_bytes()) for path in Path(package).glob("*.py")
             if path.name not in _LEFT_OUT]
    return sorted([("__main__.py", _MAIN), *found])


def archive_bytes(package: Path = PACKAGE) -> bytes:
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in sources(package):
            entry = zipfile.ZipInfo(name, date_time=_EPOCH)
            entry.external_attr = 0o644 << 16
            entry.create_system = 3  # unix, whatever the building host is
            archive.writestr(entry, data)
    return buffer.getvalue()


def build(directory: str | Path, package: Path = PACKAGE) -> Path:
    """The archive written into `directory` under a name holding its checksum, built once.

    Content-addressed, so concurrent builders write the same bytes and the rename makes one of them
    the file; an agent still running an older archive keeps its file."""
    data = archive_bytes(package)
    directory = Path(directory)
    # The name holds "muster_runner": that is how its processes are told apart (runner/processes.py).
    path = directory / f"muster_runner-{hashlib.sha256(data).hexdigest()[:16]}.pyz"
    if path.is_file() and path.read_bytes() == data:
        return path
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.")  # one per builder, thread or process
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
