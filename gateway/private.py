"""Files that hold tenants' data are readable by this user only (found by QA: under umask 022 the
embedded Redis's snapshot, with every tenant's cached prompts and answers, the usage spool and the
SQLite database were readable by every local user)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: str | os.PathLike[str], *, tighten: bool = False) -> Path:
    """Create ``path`` (and its parents) as an owner-only folder. ``tighten``: one that exists and
    belongs to this user is made owner-only too, for a folder only pagegate uses (the embedded
    Redis's ``redis/``); a folder the operator named (the spool) is left as it is (found by a
    re-check QA: a spool set to an existing folder had its mode changed)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    if tighten:
        with contextlib.suppress(OSError):
            if folder.stat().st_uid == os.geteuid() and folder.stat().st_mode & 0o077:
                folder.chmod(PRIVATE_DIR)
    return folder


def private_file(path: str | os.PathLike[str]) -> None:
    """Create ``path`` empty and owner-only when it does not exist (SQLite then keeps the mode for
    its ``-wal`` and ``-shm`` files); an existing file is left as it is."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE))
