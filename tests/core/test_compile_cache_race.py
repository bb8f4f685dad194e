"""Servers sharing one compile cache folder, at the same moment (issue 45): a reader never moves a healthy folder
aside while another process rewrites a recorded file, and a content-addressed artifact is written once.

On 2363d88 ``read_trusted`` read the file record and then the file without the cross-process lock: a process that
rewrote the record between the two (a precompiled block's variants, rewritten by every save) made the reader see
new bytes under the old checksum, and it moved the whole key folder aside as "an artifact changed since it was
written" (the first test fails there within a second). Opening the folder checked every recorded file without the
lock too, so a server starting while another saved could move it aside the same way (the first test's reader opens
while the writer may already write). Bounded: each process stops after its count or 20 s.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from steadfast.core.compile.warm import cache as cc

REL = "precompiled/record.json"


def _writer(root: str, rounds: int, start) -> None:
    cache = cc.open_cache(Path(root), device="cpu")
    start.wait()
    deadline = time.monotonic() + 20
    for i in range(rounds):
        cache.write_recorded(REL, (f'{{"variants": [{i}]}}' + " " * (i % 97)).encode())
        if time.monotonic() > deadline:
            break


def _reader(root: str, rounds: int, start, out) -> None:
    cache = cc.open_cache(Path(root), device="cpu")
    start.wait()
    problems, reads = [], 0
    deadline = time.monotonic() + 20
    for _ in range(rounds):
        data, problem = cache.read_trusted(REL)
        reads += data is not None
        if problem is not None:
            problems.append(problem)
            break
        if time.monotonic() > deadline:
            break
    out.put((reads, problems))


def test_a_reader_never_moves_the_folder_aside_while_another_process_rewrites_a_record(tmp_path):
    ctx = multiprocessing.get_context("fork")
    cache = cc.open_cache(tmp_path, device="cpu")
    cache.write_recorded(REL, b'{"variants": []}')
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(str(tmp_path), 3000, start)),
        ctx.Process(target=_reader, args=(str(tmp_path), 3000, start, out)),
    ]
    for p in procs:
        p.start()
    start.set()
    reads, problems = out.get(timeout=60)
    for p in procs:
        p.join(timeout=60)
    moved = sorted(p.name for p in cache.root.iterdir() if ".bad-" in p.name)
    assert problems == [] and moved == [], (problems, moved)
    assert reads > 100  # the reader did read, while the writer wrote


def test_a_content_addressed_file_is_written_once(tmp_path):
    """``write_once``: a name already recorded is left as it is (a reader may hold it open), even when the bytes
    handed in differ (another process's serialisation of the same variant); the first bytes stay readable."""
    cache = cc.open_cache(tmp_path, device="cpu")
    assert cache.write_once("precompiled/a.pt2", b"first") is True
    assert cache.write_once("precompiled/a.pt2", b"second") is False
    assert cache.read_trusted("precompiled/a.pt2") == (b"first", None)


@pytest.mark.parametrize("rounds", [200])
def test_two_processes_saving_the_same_variant_at_once_both_keep_working(tmp_path, rounds):
    """Two processes write the same content-addressed names and rewrite one record at once; afterwards every name
    reads back trusted and the folder was never moved aside."""
    ctx = multiprocessing.get_context("fork")
    cc.open_cache(tmp_path, device="cpu")
    start = ctx.Event()

    def save(tag: str) -> None:
        cache = cc.open_cache(tmp_path, device="cpu")
        start.wait()
        for i in range(rounds):
            cache.write_once(f"precompiled/{i % 7}.pt2", f"artifact {i % 7} from {tag}".encode())
            cache.write_recorded(REL, f"record {i} from {tag}".encode())
            data, problem = cache.read_trusted(f"precompiled/{i % 7}.pt2")
            assert problem is None and data is not None

    procs = [ctx.Process(target=save, args=(tag,)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    cache = cc.open_cache(tmp_path, device="cpu")
    assert not [p for p in cache.root.iterdir() if ".bad-" in p.name]
    for i in range(7):
        data, problem = cache.read_trusted(f"precompiled/{i}.pt2")
        assert problem is None and data is not None and data.startswith(f"artifact {i} from ".encode())
