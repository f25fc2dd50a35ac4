"""``semviz.output.files``: bounded reads, atomic writes, output paths checked before any work."""

from __future__ import annotations

import doctest
import os

import pytest

from semviz.output import escape, files
from semviz.output.files import FileError


def test_docstring_examples():
    for module in (files, escape):
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        assert doctest.testmod(module, optionflags=flags).failed == 0


def test_reads_are_bounded_and_only_of_regular_files(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"x" * 100)
    assert files.read_bytes(p, 100) == b"x" * 100
    with pytest.raises(FileError, match="larger than the 99 bytes limit"):
        files.read_bytes(p, 99)
    with pytest.raises(FileError, match="is not a regular file"):
        files.read_bytes("/dev/zero", 10)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would block until a writer came: refused before opening
    with pytest.raises(FileError, match="is not a regular file"):
        files.read_text(fifo, 10)
    with pytest.raises(FileError, match="it is a folder"):
        files.read_text(tmp_path, 10)
    with pytest.raises(FileError, match="no such file"):
        files.read_text(tmp_path / "nope", 10)
    p.write_bytes("café".encode("latin-1"))
    with pytest.raises(FileError, match=r"is not UTF-8 text \(bad byte at offset 3\)"):
        files.read_text(p, 10)


class CountingEncoder:
    """A whitespace tokenizer that remembers how much text it was given."""

    def __init__(self) -> None:
        self.longest = 0

    def __call__(self, text: str) -> list[int]:
        self.longest = max(self.longest, len(text))
        return [len(w) for w in text.split()]


def test_read_tokens_reads_only_what_the_tokens_need(tmp_path):
    p = tmp_path / "big.txt"
    words = [f"w{i % 97}é" for i in range(300_000)]  # multi-byte text, ~2 MB
    p.write_text(" ".join(words), encoding="utf-8")
    enc = CountingEncoder()
    ids = files.read_tokens(p, enc, 16, limit=1 << 30)
    assert ids == [len(w) for w in words[:16]]
    assert enc.longest <= 8192  # one first chunk, not the 2 MB file
    enc = CountingEncoder()
    ids = files.read_tokens(p, enc, 10_000, limit=1 << 30)
    assert ids == [len(w) for w in words[:10_000]]
    assert enc.longest < 4 * len(" ".join(words[:10_016]))


def test_read_tokens_gives_all_of_a_short_file_and_refuses_bad_text(tmp_path):
    p = tmp_path / "short.txt"
    p.write_text("only three words")
    assert files.read_tokens(p, CountingEncoder(), 100, limit=1 << 20) == [4, 5, 5]
    with pytest.raises(FileError, match="hold fewer than 100 tokens"):
        files.read_tokens(p, CountingEncoder(), 100, limit=5)
    p.write_bytes(b"ok " * 5000 + b"\xff")
    with pytest.raises(FileError, match="bad byte at offset 15,000"):
        files.read_tokens(p, CountingEncoder(), 10_000, limit=1 << 20)
    with pytest.raises(FileError, match="not a regular file"):
        files.read_tokens("/dev/zero", CountingEncoder(), 10, limit=1 << 20)


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    p = tmp_path / "out.txt"
    files.write_text(p, "first")
    with pytest.raises(OSError, match="disk full"), files.atomic_path(p) as tmp:
        tmp.write_text("half of the sec")
        raise OSError("disk full")
    assert p.read_text() == "first"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"]
    files.write_text(p, "second")
    assert p.read_text() == "second" and len(list(tmp_path.iterdir())) == 1


def test_output_file_checks(tmp_path):
    assert files.check_out_file(tmp_path / "new.json") == tmp_path / "new.json"
    (tmp_path / "old.json").write_text("x")
    with pytest.raises(FileError, match="already exists: pass --force to replace it"):
        files.check_out_file(tmp_path / "old.json")
    files.check_out_file(tmp_path / "old.json", force=True)
    with pytest.raises(FileError, match="it is a folder; give a file name"):
        files.check_out_file(tmp_path)
    with pytest.raises(FileError, match="the folder .*nodir does not exist"):
        files.check_out_file(tmp_path / "nodir" / "x.json")
    with pytest.raises(FileError, match="exists and is not a regular file"):
        files.check_out_file("/dev/null", force=True)
    with pytest.raises(FileError, match="no file can be made in /proc"):
        files.check_out_file("/proc/semviz-test.json")
    with pytest.raises(FileError, match="is empty"):
        files.check_out_file("")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["old.json"]  # the probes are gone


def test_output_folder_checks(tmp_path):
    files.check_out_dir(tmp_path / "new", names=["report.html"])
    assert not (tmp_path / "new").exists()  # checked, not created
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "notes.txt").write_text("mine")
    files.check_out_dir(tmp_path / "rep", names=["report.html", "png"])  # other files: fine
    (tmp_path / "rep" / "png").mkdir()
    with pytest.raises(FileError, match="already holds png: pass --force to replace them"):
        files.check_out_dir(tmp_path / "rep", names=["report.html", "png"])
    files.check_out_dir(tmp_path / "rep", force=True, names=["report.html", "png"])
    with pytest.raises(FileError, match="it is a file, not a folder"):
        files.check_out_dir(tmp_path / "rep" / "notes.txt")
    with pytest.raises(FileError, match="does not exist"):
        files.check_out_dir(tmp_path / "a" / "b")
