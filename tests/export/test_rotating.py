"""The size-bounded file of whole lines (otel_llm.export.rotating): when it rotates, which
previous files it keeps, how ``rotated_files`` lists them, and paths it cannot write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_llm.export.rotating import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, RotatingAppender, rotated_files


def line(char: str, size: int = 10) -> bytes:
    return char.encode() * (size - 1) + b"\n"


def names(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


def test_defaults() -> None:
    appender = RotatingAppender("unused")
    assert (appender.max_bytes, appender.backups) == (DEFAULT_MAX_BYTES, DEFAULT_BACKUPS)
    assert (DEFAULT_MAX_BYTES, DEFAULT_BACKUPS) == (100 * 1024 * 1024, 1)


def test_a_file_may_reach_its_size_exactly_and_rotates_on_the_next_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    appender = RotatingAppender(str(path), max_bytes=30, backups=1)
    for char in "abc":
        appender.append(line(char))
    assert names(tmp_path) == ["t.jsonl"]
    assert path.read_bytes() == line("a") + line("b") + line("c")  # 30 bytes: not over
    appender.append(line("d"))
    assert names(tmp_path) == ["t.jsonl", "t.jsonl.1"]
    assert (tmp_path / "t.jsonl.1").read_bytes() == line("a") + line("b") + line("c")
    assert path.read_bytes() == line("d")


def test_a_line_larger_than_the_size_is_written_whole(tmp_path: Path) -> None:
    """An empty file is never rotated: a line over ``max_bytes`` goes alone into a fresh file."""
    path = tmp_path / "t"
    appender = RotatingAppender(str(path), max_bytes=10, backups=1)
    appender.append(line("a", 25))
    assert path.read_bytes() == line("a", 25) and names(tmp_path) == ["t"]
    appender.append(line("b", 25))
    assert (tmp_path / "t.1").read_bytes() == line("a", 25)
    assert path.read_bytes() == line("b", 25)


def test_several_lines_in_one_append_stay_in_one_file(tmp_path: Path) -> None:
    path = tmp_path / "t"
    appender = RotatingAppender(str(path), max_bytes=25, backups=1)
    appender.append(line("a"))
    appender.append(line("b") + line("c"))  # 10 + 20 > 25: rotate first, then write both
    assert (tmp_path / "t.1").read_bytes() == line("a")
    assert path.read_bytes() == line("b") + line("c")


def test_backups_shift_and_the_oldest_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "t"
    appender = RotatingAppender(str(path), max_bytes=10, backups=2)
    for char in "abcde":
        appender.append(line(char))
    assert names(tmp_path) == ["t", "t.1", "t.2"]
    assert [Path(p).read_bytes() for p in rotated_files(str(path))] == [line("c"), line("d"), line("e")]


def test_rotation_continues_a_file_left_by_an_earlier_run(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_bytes(line("x") * 3)
    (tmp_path / "t.1").write_bytes(line("w"))
    appender = RotatingAppender(str(path), max_bytes=30, backups=2)
    appender.append(line("y"))
    assert [Path(p).read_bytes() for p in rotated_files(str(path))] == [line("w"), line("x") * 3, line("y")]


def test_zero_backups_truncates_in_place(tmp_path: Path) -> None:
    path = tmp_path / "t"
    appender = RotatingAppender(str(path), max_bytes=15, backups=0)
    appender.append(line("a"))
    appender.append(line("b"))
    assert names(tmp_path) == ["t"] and path.read_bytes() == line("b")


@pytest.mark.parametrize(("max_bytes", "backups", "expected"), [
    (-5, 1, (0, 1)),  # a negative size never rotates
    ("64", "3", (64, 3)),  # strings from the environment
    (10, -1, (10, 0)),
    (10, 1000, (10, 100)),  # at most 100 previous files
])
def test_size_and_backups_are_clamped(max_bytes: int, backups: int, expected: tuple[int, int]) -> None:
    appender = RotatingAppender("unused", max_bytes=max_bytes, backups=backups)
    assert (appender.max_bytes, appender.backups) == expected


def test_zero_size_never_rotates(tmp_path: Path) -> None:
    path = tmp_path / "t"
    appender = RotatingAppender(str(path), max_bytes=0, backups=3)
    for char in "abcdef":
        appender.append(line(char, 1000))
    assert names(tmp_path) == ["t"] and path.stat().st_size == 6000


def test_the_file_is_created_on_first_append_and_not_before(tmp_path: Path) -> None:
    path = tmp_path / "t"
    appender = RotatingAppender(str(path), max_bytes=100)
    assert not path.exists()
    appender.append(b"")
    assert path.exists() and path.stat().st_size == 0


def test_a_writer_that_held_the_rotated_file_writes_to_the_new_one(tmp_path: Path) -> None:
    """Another process rotated the file while this one waited for the lock: the line goes to the
    file now at ``path``, not into the backup."""
    path = tmp_path / "t"
    appender = RotatingAppender(str(path), max_bytes=1000, backups=1)
    appender.append(line("a"))
    stale = open(path, "ab")
    os.replace(path, tmp_path / "t.1")  # the other process's rotation
    path.write_bytes(b"")
    current = appender._locked_current(stale)
    try:
        current.write(line("b"))
    finally:
        current.close()
    assert stale.closed
    assert (tmp_path / "t.1").read_bytes() == line("a")
    assert path.read_bytes() == line("b")


def test_a_missing_folder_raises_os_error(tmp_path: Path) -> None:
    appender = RotatingAppender(str(tmp_path / "no" / "such" / "t"), max_bytes=10)
    with pytest.raises(FileNotFoundError):
        appender.append(line("a"))


def test_a_folder_as_the_path_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        RotatingAppender(str(tmp_path), max_bytes=10).append(line("a"))


def test_a_file_as_a_parent_folder_raises_os_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        RotatingAppender(str(tmp_path / "plain" / "t"), max_bytes=10).append(line("a"))


def test_rotated_files_lists_backups_oldest_first_then_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    assert list(rotated_files(path)) == [path]  # nothing yet: still the file itself
    for index in (1, 2, 3):
        Path(f"{path}.{index}").write_bytes(b"")
    assert list(rotated_files(path)) == [f"{path}.3", f"{path}.2", f"{path}.1", path]


def test_rotated_files_stops_at_the_first_missing_backup(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    for index in (1, 2, 4):
        Path(f"{path}.{index}").write_bytes(b"")
    assert list(rotated_files(path)) == [f"{path}.2", f"{path}.1", path]
    os.remove(f"{path}.1")
    assert list(rotated_files(path)) == [path]


def test_rotated_files_looks_at_most_100_backups_back(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    for index in range(1, 103):
        Path(f"{path}.{index}").write_bytes(b"")
    listed = list(rotated_files(path))
    assert len(listed) == 101
    assert listed[0] == f"{path}.100" and listed[-1] == path
