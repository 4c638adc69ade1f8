"""Where workers' snapshots live: the private metrics directory and its files.

The directory is private: unless the user names one, the process that resolves
the engine config makes it with ``tempfile.mkdtemp`` (mode 0700, a random
name; inside vLLM's ``PROMETHEUS_MULTIPROC_DIR`` when that is set) and names it
in the environment, which the engine and worker processes inherit; that
process alone removes it, at its exit. Every use opens it without following a
symlink and checks it is a directory of this user with no access for others,
so a name another local user planted or replaced is refused, not written
through. A snapshot is ``worker-<pid>.json``, written whole and read only
while its writer lives.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

METRICS_DIR_ENV = "SPECEXTEND_METRICS_DIR"
PROMETHEUS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""vLLM's multiprocess metrics directory (it makes one for several API servers)."""
DIR_PREFIX = "specextend-metrics-"
Warn = Callable[[str], None]


class UnsafeMetricsDir(OSError):
    """The metrics directory is not one only this user can read and write."""


_warned: set[str] = set()


def warn_once(warn: Warn | None, key: str, message: str) -> None:
    """Log ``message`` unless this process already warned about ``key`` (a
    directory and a kind of trouble): a failure that lasts would otherwise
    repeat every interval."""
    if key in _warned:
        return
    _warned.add(key)
    (warn or logging.getLogger(__name__).warning)(message)


def open_private_dir(path: Path, create: bool = False) -> int:
    """A descriptor of directory ``path`` once checked private: not a symlink,
    owned by this user, no permission bits for group or others (0700).
    ``create``: make a missing ``path`` first (mode 0700, its parent must
    exist). Raises ``UnsafeMetricsDir`` (its message names the fix), or
    ``OSError``: ``FileNotFoundError`` when it is missing."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    # lstat only words the refusal; the checks that count are on what was opened.
    if stat.S_ISLNK(os.lstat(path).st_mode):
        raise UnsafeMetricsDir(
            f"{path} is a symlink, which is not followed: point "
            f"{METRICS_DIR_ENV} at a directory of your own with mode 0700, or "
            "unset it so that the plugin makes a private one"
        )
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except NotADirectoryError:
        raise UnsafeMetricsDir(
            f"{path} is not a directory: remove it, or point {METRICS_DIR_ENV} at "
            "a directory of your own with mode 0700"
        ) from None
    try:
        _check_private(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_private(path: Path, st: os.stat_result) -> None:
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeMetricsDir(
            f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid}), "
            f"who could forge or read its snapshots: point {METRICS_DIR_ENV} at a "
            "directory of your own with mode 0700, or unset it"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise UnsafeMetricsDir(
            f"{path} has mode {mode:04o}, so other users could forge or read its "
            f"snapshots: chmod 700 {path}"
        )


def metrics_dir() -> Path | None:
    """The snapshot directory named for this process tree, if any (unchecked)."""
    path = os.environ.get(METRICS_DIR_ENV)
    return Path(path) if path else None


_own_dirs: dict[Path, int] = {}
"""Directories ``ensure_metrics_dir`` made: {path: pid of the process that did}."""


def ensure_metrics_dir(warn: Warn | None = None) -> Path | None:
    """Where this process tree publishes, before its engine processes start.

    A directory named in ``SPECEXTEND_METRICS_DIR`` is the user's: it is made
    if missing, checked, and never removed; a refused one is returned (and
    warned about once) so that readers and writers keep refusing it, and the
    engine runs without publishing. Otherwise a private one is made, named in
    the environment for the engine and worker processes, and removed when this
    process exits. None when none could be made.
    """
    named = metrics_dir()
    if named is not None:
        try:
            os.close(open_private_dir(named, create=True))
        except OSError as e:
            warn_not_published(warn, named, e)
        return named
    parents = [os.environ.get(PROMETHEUS_DIR_ENV) or None, None]
    for parent in dict.fromkeys(parents):
        try:
            path = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=parent))
            break
        except OSError as e:
            error = e
    else:
        warn_once(
            warn, "mkdtemp",
            f"SpecExtend metrics: cannot make a private snapshot directory "
            f"({error}); vllm:spec_extend_* stay off /metrics, the engine runs "
            f"on. Fix: make TMPDIR writable, or set {METRICS_DIR_ENV} to a "
            "directory of your own with mode 0700.",
        )
        return None
    os.environ[METRICS_DIR_ENV] = str(path)
    if not _own_dirs:
        atexit.register(remove_own_dirs)
    _own_dirs[path] = os.getpid()
    return path


def remove_own_dirs() -> None:
    """At exit: remove the directories this process made, once their writers
    have exited. A forked child inherits the exit handler but not the
    directory; one a writer still publishes to, or one no longer ours, stays."""
    for path, pid in list(_own_dirs.items()):
        if pid != os.getpid():
            continue
        del _own_dirs[path]
        try:
            fd = open_private_dir(path)
        except OSError:
            continue
        try:
            names = os.listdir(fd)
            writers = {_writer_pid(name) for name in names} - {None, os.getpid()}
            if any(_alive(writer) for writer in writers):
                continue
            for name in names:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(path)


def warn_not_published(warn: Warn | None, directory: Path, error: Exception) -> None:
    kind = type(error).__name__
    warn_once(
        warn, f"{directory}: {kind}",
        f"SpecExtend metrics: not publishing to {directory}: {kind}: {error}. "
        "vllm:spec_extend_* on /metrics miss these counts until it is usable "
        "again (checked at every report and scrape); counters keep counting "
        "and the engine runs on.",
    )


def _writer_pid(name: str) -> int | None:
    """The pid in a snapshot's name (``worker-<pid>.json`` or ``.tmp``)."""
    stem, _, suffix = name.partition(".")
    kind, _, pid = stem.partition("-")
    if kind != "worker" or suffix not in ("json", "tmp") or not pid.isdigit():
        return None
    return int(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    return True


def write_snapshot(path: Path, data: bytes) -> bool:
    """Replace snapshot ``path`` by ``data`` inside its checked directory;
    True when the directory was missing and made again."""
    try:
        fd = open_private_dir(path.parent)
        made = False
    except FileNotFoundError:
        fd = open_private_dir(path.parent, create=True)
        made = True
    try:
        tmp = path.with_suffix(".tmp").name
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, 0o600, dir_fd=fd), "wb") as f:
            f.write(data)
        os.replace(tmp, path.name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    return made


def read_snapshot(dir_fd: int, name: str) -> dict | None:
    """A live worker's snapshot in the directory open as ``dir_fd``."""
    pid = _writer_pid(name)
    # A worker that died without cleaning up no longer counts.
    if pid is None or not name.endswith(".json") or not _alive(pid):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(name, flags, dir_fd=dir_fd), "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):  # gone meanwhile, or not ours to read
        return None
    return data if isinstance(data, dict) else None
