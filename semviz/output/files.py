"""Files semviz reads and writes: bounded reads, atomic writes, output paths checked up front.

Every read has a size limit and refuses what is not a regular file (a folder, ``/dev/zero``,
a FIFO that would block), so a path typed by a user can neither exhaust memory nor hang.
Every write goes to a temp file in the target's folder and is renamed over the target, so a
crash or a full disk never leaves half a file, and the temp file is removed on failure.
Output paths are checked before any work starts (``check_out_file``, ``check_out_dir``): an
existing file is replaced only when the caller says ``force``.

Each function fails with a :class:`FileError` whose message is one sentence.

Examples
--------
>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> p = check_out_file(os.path.join(d, "t.json"), force=False)
>>> _ = write_text(p, "hello")
>>> read_text(p, limit=1024)
'hello'
>>> check_out_file(p, force=False)
Traceback (most recent call last):
...
semviz.output.files.FileError: ... already exists: pass --force to replace it
"""

from __future__ import annotations

import codecs
import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

__all__ = [
    "MiB",
    "FileError",
    "atomic_path",
    "check_in_file",
    "check_out_dir",
    "check_out_file",
    "read_bytes",
    "read_text",
    "read_tokens",
    "write_bytes",
    "write_text",
]

MiB = 1 << 20


class FileError(ValueError):
    """A path that cannot be read or written as asked; the message is one sentence."""


def _size(n: int) -> str:
    return f"{n / MiB:,.0f} MiB" if n >= MiB else f"{n:,} bytes"


def _why(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


# -- reading -----------------------------------------------------------------------------------


def _open_regular(path: str | Path):
    """Open ``path`` for binary reading if it is a regular file (checked before opening, so a
    FIFO is refused rather than blocked on)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileError(f"cannot read {path}: {_why(exc)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise FileError(f"cannot read {path}: it is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise FileError(f"cannot read {path}: it is not a regular file")
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller closes it)
    except OSError as exc:
        raise FileError(f"cannot read {path}: {_why(exc)}") from None


def check_in_file(path: str | Path) -> Path:
    """Check that ``path`` is a regular file this process can open, before the work."""
    _open_regular(path).close()
    return Path(path)


def read_bytes(path: str | Path, limit: int) -> bytes:
    """The whole file, refused when it is larger than ``limit`` bytes (never read past it)."""
    with _open_regular(path) as f:
        try:
            # the file's size, not the limit, sizes the buffer: a small file costs its bytes
            want = min(os.fstat(f.fileno()).st_size, limit) + 1
            data = f.read(want)
            if len(data) == want <= limit:  # it grew since: read on up to the limit
                data += f.read(limit + 1 - want)
        except OSError as exc:
            raise FileError(f"cannot read {path}: {_why(exc)}") from None
    if len(data) > limit:
        raise FileError(f"{path} is larger than the {_size(limit)} limit for this file")
    return data


def read_text(path: str | Path, limit: int) -> str:
    """The whole file as UTF-8 text, at most ``limit`` bytes."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileError(f"{path} is not UTF-8 text (bad byte at offset {exc.start:,})") from None


def read_tokens(
    path: str | Path,
    encode: Callable[[str], Sequence[int]],
    n_tokens: int,
    *,
    limit: int,
    margin: int = 16,
) -> list[int]:
    """The first ``n_tokens`` token ids of a UTF-8 text file, reading only what they need.

    The file is read in chunks that double in size, each decoded incrementally (a multi-byte
    character split across chunks is joined, bad UTF-8 is refused), and the text read so far
    is tokenised after each chunk. Reading stops once ``n_tokens + margin`` tokens are there:
    a tokenizer may merge across the cut, so only tokens well before it are kept, which makes
    the result the same as tokenising the whole file and taking its first ``n_tokens``.
    Fewer ids come back when the file ends first; more than ``limit`` bytes are never read.
    """
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    text, done, chunk = "", 0, max(4096, 8 * (n_tokens + margin))
    with _open_regular(path) as f:
        while True:
            want = min(chunk, limit + 1 - done)
            try:
                raw = f.read(want)
                text += dec.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                at = done + exc.start
                raise FileError(f"{path} is not UTF-8 text (bad byte at offset {at:,})") from None
            except OSError as exc:
                raise FileError(f"cannot read {path}: {_why(exc)}") from None
            done += len(raw)
            if done > limit:
                raise FileError(
                    f"{path}: {_size(limit)} of text hold fewer than {n_tokens:,} tokens"
                )
            ids = list(encode(text))
            if not raw or len(ids) >= n_tokens + margin:
                return ids[:n_tokens]
            chunk *= 2


# -- writing -----------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path beside ``path`` to write to; renamed over ``path`` when the block succeeds.

    On any failure (or Ctrl-C) the temp file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file, flush to disk, rename)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically."""
    return write_bytes(path, text.encode("utf-8"))


# -- output paths, checked before any work -----------------------------------------------------


def _probe_writable(folder: Path, shown: str | Path) -> None:
    """Create and remove a file in ``folder``: the only check that holds for every case (a
    read-only mount, permissions, root, ``/proc``)."""
    probe = folder / f".semviz-probe-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise FileError(
            f"cannot write {shown}: no file can be made in {folder} ({_why(exc)})"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        probe.unlink()


def _existing_folder(folder: Path, shown: str | Path) -> None:
    if not folder.exists():
        raise FileError(f"cannot write {shown}: the folder {folder} does not exist")
    if not folder.is_dir():
        raise FileError(f"cannot write {shown}: {folder} is not a folder")


def check_out_file(path: str | Path, *, force: bool = False) -> Path:
    """Check that a file can be written at ``path``, before the work that makes it.

    Refused: a folder, something other than a regular file, an existing file without
    ``force``, a folder that does not exist or cannot be written to.
    """
    p = Path(path)
    if str(path).strip() == "":
        raise FileError("the output path is empty")
    if p.is_dir():
        raise FileError(f"cannot write {path}: it is a folder; give a file name")
    if p.exists() or p.is_symlink():
        if not p.is_file():
            raise FileError(f"cannot write {path}: it exists and is not a regular file")
        if not force:
            raise FileError(f"{path} already exists: pass --force to replace it")
    parent = p.parent if str(p.parent) else Path(".")
    _existing_folder(parent, path)
    _probe_writable(parent, path)
    return p


def check_out_dir(path: str | Path, *, force: bool = False, names: Iterable[str] = ()) -> Path:
    """Check that a folder of outputs can be written at ``path``, before the work.

    The folder may exist; ``names`` are the entries the caller will write in it, and any of
    them already there needs ``force``. Other files in the folder are left alone.
    """
    p = Path(path)
    if str(path).strip() == "":
        raise FileError("the output folder is empty")
    if p.exists():
        if not p.is_dir():
            raise FileError(f"cannot write into {path}: it is a file, not a folder")
        there = sorted(n for n in names if (p / n).exists() or (p / n).is_symlink())
        if there and not force:
            raise FileError(
                f"{path} already holds {', '.join(there)}: pass --force to replace them"
            )
        _probe_writable(p, path)
        return p
    parent = p.parent if str(p.parent) else Path(".")
    _existing_folder(parent, path)
    _probe_writable(parent, path)
    return p
