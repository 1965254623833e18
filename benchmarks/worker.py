"""One measured operation in a fresh process, so its peak RSS is its own.

``python -m benchmarks.worker OP TARGET SIZE`` prints ``{"seconds": ..., "maxrss_kib": ...}``.
``seconds`` is the operation alone, timed with ``time.perf_counter`` inside this process: imports
and set-up (opening the store, making the data) run before the clock starts, each op marking the
measured part with ``with timed():``. ``maxrss_kib`` is the whole process's peak RSS.
TARGET is a local path, or for the ``smb_*`` ops an ``smb://user@host:port/share/dir/name`` URL
(password from ``COMMITSTORE_SMB_PASSWORD``).
OPs: ``naive_write`` (write the final name + fsync, no staging, no hash: the unsafe baseline),
``stage_commit`` (commitstore ``stage()`` + commit), ``naive_small`` and ``small_commit`` (many
1 KiB files: a write + fsync of file and folder each, against ``put_bytes``), ``plain_read``
(read the file to the end), ``verify_full`` (``verify(name, level="full")``).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from commitstore import open_store

CHUNK = 4 * 1024 * 1024
_clock: list[float] = []


@contextlib.contextmanager
def timed() -> Iterator[None]:
    """The measured part of an op (the clock runs only inside; an op may have several)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _clock.append(time.perf_counter() - t0)


def _block() -> bytes:
    return os.urandom(CHUNK)


def naive_write(path: Path, size: int) -> None:
    block = _block()
    with timed(), open(path, "wb") as f:
        for _ in range(size // CHUNK):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def dd_direct(path: Path, size: int) -> None:
    """A device write limit: ``dd if=/dev/zero bs=16M oflag=direct conv=fsync`` (no page cache,
    one write in flight; smaller blocks for a size under 16 MiB)."""
    import subprocess

    bs = min(16 << 20, size)
    argv = ["dd", "if=/dev/zero", f"of={path}", f"bs={bs}", f"count={size // bs}"]
    with timed():
        subprocess.run([*argv, "oflag=direct", "conv=fsync"], check=True, capture_output=True)


FIO_IODEPTH = 16
"""Writes ``fio_direct`` keeps in flight."""


def fio_direct(path: Path, size: int) -> float:
    """The device's write limit as ``fio`` measures it: a sequential write of ``size`` bytes with
    ``O_DIRECT`` through libaio, :data:`FIO_IODEPTH` 4 MiB writes in flight; then an ``fsync`` of
    the file. The time is fio's own measure of its writes (whole milliseconds, at least one) plus
    the ``fsync``'s: the ``fio`` process itself spends about half a second starting and stopping
    even with no I/O at all, which a time of the whole process would charge to the device."""
    import subprocess

    bs = min(CHUNK, size)
    argv = [
        "fio", "--name=limit", f"--filename={path}", "--rw=write", f"--bs={bs}",
        f"--size={size // bs * bs}", "--direct=1", "--ioengine=libaio",
        f"--iodepth={FIO_IODEPTH}", "--fallocate=none", "--output-format=json",
    ]  # fmt: skip
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    if job["error"] or job["write"]["io_bytes"] != size // bs * bs:
        raise RuntimeError(f"fio wrote {job['write']['io_bytes']} bytes, error {job['error']}")
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        os.fsync(fd)
        synced = time.perf_counter() - t0
    finally:
        os.close(fd)
    return max(int(job["write"]["runtime"]), 1) / 1000 + synced


def direct_writes(path: Path, size: int) -> None:
    """The large commit's own writes without the library: the file opened with ``O_DIRECT`` and
    written in :data:`_direct.BUFFER` pieces by :data:`_direct.DEPTH` threads taking them in
    order, each with ``pwrite`` at its offset from a buffer filled before the clock starts,
    then ``fsync``. No staging name, hash, copy into a ring, record or folder sync: what the
    direct writer's I/O itself costs on this disk, the floor of ``stage_commit`` (reported)."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    from commitstore.backends.rename.posix import _direct

    piece = _direct.BUFFER
    bufs = [mmap.mmap(-1, piece) for _ in range(_direct.BUFFERS)]
    for buf in bufs:
        buf[:] = os.urandom(piece)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)

    def one(i: int) -> None:
        offset = i * piece
        length = min(piece, size - offset)
        with memoryview(bufs[i % len(bufs)]) as view:
            done = 0
            while done < length:
                done += os.pwrite(fd, view[done:length], offset + done)

    try:
        with timed(), ThreadPoolExecutor(_direct.DEPTH) as pool:
            list(pool.map(one, range(-(-size // piece))))
            os.fsync(fd)
    finally:
        os.close(fd)
        for buf in bufs:
            buf.close()


def stage_commit(path: Path, size: int) -> None:
    block = _block()
    store = open_store(path.parent)
    with timed(), store.stage(path.name, overwrite=True) as st:
        for _ in range(size // CHUNK):
            st.write(block)


SMALL_BYTES = 1024
"""The size of each artifact of the small-commit pair (``naive_small``, ``small_commit``)."""


def naive_small(path: Path, size: int) -> None:
    """The small commit's baseline: ``size // SMALL_BYTES`` files of :data:`SMALL_BYTES`, each
    written to its final name beside ``path``, then ``fsync`` of the file and of its folder (the
    unsafe way, made durable: no staging, no hash, no record)."""
    data = os.urandom(SMALL_BYTES)
    folder = path.parent
    with timed():
        for i in range(size // SMALL_BYTES):
            fd = os.open(folder / f"{path.name}.{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            dirfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dirfd)
            finally:
                os.close(dirfd)


def small_floor(path: Path, size: int) -> None:
    """The small commit's protocol without the library: for each of ``size // SMALL_BYTES``
    artifacts, the syscalls of one ``put_bytes`` (``tests/test_sync_count.py``) in the same
    order and with the same overlap, and nothing else: the data written to a staging file and
    fsynced on a worker thread while a pending record is written in the records folder (its
    file fsynced on another worker, its folder fsynced here); the data renamed onto its name
    and its folder fsynced; the pending record renamed onto the record and the records folder
    fsynced. No lock, no hash, no checks: what the crash order itself costs, the floor a
    commit's code could reach."""
    from concurrent.futures import ThreadPoolExecutor

    data = os.urandom(SMALL_BYTES)
    folder = path.parent
    records = folder / "records"
    records.mkdir(exist_ok=True)

    def write_synced(where: Path) -> None:
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def sync_folder(where: Path) -> None:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(2) as pool, timed():
        for i in range(size // SMALL_BYTES):
            name = f"{path.name}.{i}"
            staged = pool.submit(write_synced, folder / f".tmp.{name}")
            pending = pool.submit(write_synced, records / f".new.{name}")
            sync_folder(records)
            staged.result()
            pending.result()
            os.rename(folder / f".tmp.{name}", folder / name)
            sync_folder(folder)
            os.rename(records / f".new.{name}", records / f"rec.{name}")
            sync_folder(records)


def small_commit(path: Path, size: int) -> None:
    """commitstore: ``put_bytes`` of ``size // SMALL_BYTES`` new artifacts of
    :data:`SMALL_BYTES` into the store at ``path``'s folder (one commit each: pending record,
    data, record). One untimed commit first, so the store's folders and lock file exist."""
    data = os.urandom(SMALL_BYTES)
    store = open_store(path.parent)
    store.put_bytes(f"{path.name}.warm", data, overwrite=True)
    with timed():
        for i in range(size // SMALL_BYTES):
            store.put_bytes(f"{path.name}.{i}", data)


def stage_commit_no_writeback(path: Path, size: int) -> None:
    """``stage_commit`` without early writeback (isolates what sync_file_range buys)."""
    from commitstore.backends.rename.posix import backend as posix

    posix.WRITEBACK_EVERY = 1 << 62
    stage_commit(path, size)


def bridge_commit_no_readback(path: Path, size: int) -> None:
    """``stage_commit`` on a bridge with the read-back check off."""
    block = _block()
    store = open_store(path.parent, readback=False)
    with timed(), store.stage(path.name, overwrite=True) as st:
        for _ in range(size // CHUNK):
            st.write(block)


def _smb_commit(url: str, size: int, **options: Any) -> None:
    block = _block()
    parent, name = url.rsplit("/", 1)
    store = open_store(parent, **options)
    with timed(), store.stage(name, overwrite=True) as st:
        for _ in range(size // CHUNK):
            st.write(block)


def smb_commit(url: str, size: int) -> None:
    _smb_commit(url, size)


def smb_commit_readback(url: str, size: int) -> None:
    _smb_commit(url, size, readback=True)


def smb_raw_write(url: str, size: int) -> None:
    """The baseline: smbclient.open_file + write + SMB2 FLUSH, straight to the final name."""
    import smbclient

    parts = urlsplit(url)
    unc = "\\\\" + str(parts.hostname) + parts.path.replace("/", "\\")
    cache: dict[str, object] = {}
    kw = {
        "port": parts.port,
        "username": parts.username,
        "password": os.environ["COMMITSTORE_SMB_PASSWORD"],
        "connection_cache": cache,
    }
    block = _block()
    with timed(), smbclient.open_file(unc, mode="wb", buffering=0, **kw) as f:
        for _ in range(size // CHUNK):
            view = memoryview(block)
            while view.nbytes:
                view = view[f.write(view) :]
        f.flush()


def _s3_options() -> dict[str, Any]:
    return {
        "endpoint_url": os.environ["BENCH_S3_ENDPOINT"],
        "key": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
    }


def s3_put_file(url: str, size: int) -> None:
    """commitstore: ``put_file`` of BENCH_SOURCE (multipart, hashed, checked, recorded)."""
    parent, name = url.rsplit("/", 1)
    store = open_store(parent, **_s3_options())
    with timed():
        store.put_file(name, os.environ["BENCH_SOURCE"], overwrite=True)


def s3fs_put_file(url: str, size: int) -> None:
    """Baseline: ``s3fs.S3FileSystem.put_file`` of the same file (no hash, no record)."""
    import s3fs

    o = _s3_options()
    fs = s3fs.S3FileSystem(
        key=o["key"], secret=o["secret"], endpoint_url=o["endpoint_url"], skip_instance_cache=True
    )
    with timed():
        fs.put_file(os.environ["BENCH_SOURCE"], url[len("s3://") :])


def s3fs_like_ours(endpoint: str, key: str, secret: str) -> Any:
    """An ``s3fs.S3FileSystem`` configured as commitstore's own client
    (``backends/object/s3/backend.py``): no SHA-256 payload signing, checksums (CRC32) only
    where the operation requires them, no ``Expect: 100-continue``. The one definition every
    matched s3fs baseline uses."""
    import s3fs

    from commitstore.backends.object.s3.timestamps import fast_session

    return s3fs.S3FileSystem(
        key=key,
        secret=secret,
        endpoint_url=endpoint,
        skip_instance_cache=True,
        session=fast_session(),
        config_kwargs={
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
            "s3": {"payload_signing_enabled": False},
        },
    )


def s3fs_put_file_like_ours(url: str, size: int) -> None:
    """Baseline: ``s3fs.put_file`` configured as commitstore's own client
    (:func:`s3fs_like_ours`)."""
    o = _s3_options()
    fs = s3fs_like_ours(o["endpoint_url"], o["key"], o["secret"])
    with timed():
        fs.put_file(os.environ["BENCH_SOURCE"], url[len("s3://") :])


def s3_resume(url: str, size: int) -> None:
    """commitstore resume: the newest artifact of the store at URL that passes
    ``latest(level="size")``, copied to BENCH_DEST with ``get_file`` (hashed on the way, published
    only if it matches its record)."""
    store = open_store(url, **_s3_options())
    with timed():
        rec = store.latest(level="size")
        assert rec is not None and rec.size == size
        store.get_file(rec.name, os.environ["BENCH_DEST"])


def s3fs_get_file(url: str, size: int) -> None:
    """Baseline: one ``s3fs.S3FileSystem.get_file`` of the newest artifact (BENCH_S3_NAME under
    URL, the name known beforehand) to BENCH_DEST: no listing, no record, no hash."""
    import s3fs

    o = _s3_options()
    fs = s3fs.S3FileSystem(
        key=o["key"], secret=o["secret"], endpoint_url=o["endpoint_url"], skip_instance_cache=True
    )
    with timed():
        fs.get_file(
            f"{url[len('s3://') :]}/{os.environ['BENCH_S3_NAME']}", os.environ["BENCH_DEST"]
        )


def _rclone(*args: str) -> None:
    """Run rclone (from the venv or PATH) with no config file; S3 flags from the environment."""
    import subprocess

    subprocess.run(_rclone_argv(*args), check=True, capture_output=True)


def _rclone_argv(*args: str) -> list[str]:
    import shutil
    import sys

    exe = shutil.which("rclone") or os.path.join(os.path.dirname(sys.executable), "rclone")
    s3: list[str] = []
    if os.environ.get("BENCH_S3_ENDPOINT"):
        o = _s3_options()
        s3 = [
            "--s3-provider", "Other",
            "--s3-endpoint", str(o["endpoint_url"]),
            "--s3-access-key-id", str(o["key"]),
            "--s3-secret-access-key", str(o["secret"]),
        ]  # fmt: skip
    return [exe, *args, "--config", "/dev/null", *s3]


def rclone_copyto(url: str, size: int) -> None:
    """Baseline: ``rclone copyto`` of the same file to the same server (rclone's defaults)."""
    with timed():
        _rclone("copyto", os.environ["BENCH_SOURCE"], ":s3:" + url[len("s3://") :])


RCLONE_FAST = ("--s3-upload-concurrency", "8", "--s3-chunk-size", "64M", "--s3-disable-checksum")
"""rclone's documented S3 upload options for large files: more parts in flight, larger parts,
and no MD5 pass over the whole file before the upload (``rclone help backend s3``)."""


def rclone_copyto_fast(url: str, size: int) -> None:
    """Baseline: ``rclone copyto`` with :data:`RCLONE_FAST`."""
    with timed():
        _rclone("copyto", *RCLONE_FAST, os.environ["BENCH_SOURCE"], ":s3:" + url[len("s3://") :])


def gcs_put_file(url: str, size: int) -> None:
    """commitstore: ``put_file`` of BENCH_SOURCE to fake-gcs-server."""
    parent, name = url.rsplit("/", 1)
    opts: dict[str, Any] = {
        "endpoint_url": os.environ["BENCH_GCS_ENDPOINT"],
        "token": "anon",
        "project": "test",
    }
    store = open_store(parent, **opts)
    with timed():
        store.put_file(name, os.environ["BENCH_SOURCE"], overwrite=True)


GCSFS_FAST_CHUNK = 256 * 1024 * 1024
"""``gcsfs_put_file_fast``'s ``chunksize`` (gcsfs's documented ``put_file`` argument; its default
is 50 MiB): fewer, larger requests of the resumable upload."""


def gcsfs_put_file(url: str, size: int) -> None:
    """Baseline: ``gcsfs.GCSFileSystem.put_file`` of the same file (no hash, no record)."""
    _gcsfs_put(url, {})


def gcsfs_put_file_fast(url: str, size: int) -> None:
    """Baseline: the same with ``chunksize=GCSFS_FAST_CHUNK``."""
    _gcsfs_put(url, {"chunksize": GCSFS_FAST_CHUNK})


def _gcsfs_put(url: str, kwargs: dict[str, Any]) -> None:
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs

    fs = gcsfs.GCSFileSystem(
        endpoint_url=os.environ["BENCH_GCS_ENDPOINT"],
        token="anon",
        project="test",
        skip_instance_cache=True,
    )
    with timed():
        fs.put_file(os.environ["BENCH_SOURCE"], url[len("gs://") :], **kwargs)


def _mirror_targets() -> list[object]:
    mirrors: list[object] = []
    if os.environ.get("BENCH_MIRROR_DIR"):
        mirrors.append(os.environ["BENCH_MIRROR_DIR"])
    if os.environ.get("BENCH_S3_ENDPOINT"):
        opts = _s3_options()
        mirrors.append(open_store(os.environ["BENCH_S3_MIRROR"], **opts))
    return mirrors


def _commit_set(path: Path, size: int, mirrors: list[object]) -> float:
    """Commit 20 artifacts of size/20 bytes; return the time the caller was blocked.

    BENCH_TRAIN_SECONDS: "training" between two commits (a sleep, as a training step waiting on
    its accelerator releases the CPU and the GIL); 0 commits back to back. Only the commits count.
    """
    each = size // 20
    block = _block()
    train = float(os.environ.get("BENCH_TRAIN_SECONDS", "0"))
    store = open_store(path, mirrors=mirrors)  # type: ignore[arg-type]
    blocked = 0.0
    for i in range(20):
        if i and train:
            time.sleep(train)
        t0 = time.perf_counter()
        with store.stage(f"step_{i:04d}.pt", overwrite=True) as st:
            for _ in range(each // CHUNK):
                st.write(block)
        blocked += time.perf_counter() - t0
    store.close()  # waits for the mirrors; not counted as blocking
    return blocked


def commit_set_without_mirrors(path: Path, size: int) -> float:
    return _commit_set(path, size, [])


def commit_set_with_mirrors(path: Path, size: int) -> float:
    """The same with the background mirrors named by BENCH_MIRROR_DIR / BENCH_S3_MIRROR."""
    return _commit_set(path, size, _mirror_targets())


def sync_to_mirrors(path: Path, size: int) -> None:
    """commitstore: replicate an existing store (BENCH_SOURCE_STORE) to the mirrors."""
    store = open_store(os.environ["BENCH_SOURCE_STORE"], mirrors=_mirror_targets())  # type: ignore[arg-type]
    with timed():
        report = store.sync()
    assert report.ok, report


def _rclone_copies() -> list[list[str]]:
    """``rclone copy --checksum`` of the store folder to each mirror."""
    src = os.environ["BENCH_SOURCE_STORE"]
    targets = []
    if os.environ.get("BENCH_MIRROR_DIR"):
        targets.append(os.environ["BENCH_MIRROR_DIR"])
    if os.environ.get("BENCH_S3_ENDPOINT"):
        targets.append(":s3:" + os.environ["BENCH_S3_MIRROR"][len("s3://") :])
    return [_rclone_argv("copy", "--checksum", src, t) for t in targets]


def rclone_copy_checksum(path: Path, size: int) -> None:
    """Baseline: ``rclone copy --checksum`` of the same store folder to each mirror in turn."""
    import subprocess

    with timed():
        for argv in _rclone_copies():
            subprocess.run(argv, check=True, capture_output=True)


def rclone_copy_checksum_parallel(path: Path, size: int) -> None:
    """Baseline: the same ``rclone copy --checksum`` runs, all at once (as sync copies to its
    mirrors side by side)."""
    import subprocess

    with timed():
        procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL) for argv in _rclone_copies()]
        failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        raise RuntimeError(f"rclone failed: {failed}")


READ_BUFFERS = {"128K": 128 << 10, "1M": 1 << 20, "8M": 8 << 20, "64M": 64 << 20, "whole": 0}
"""The buffer sizes the local suite sweeps ``plain_read`` over (``whole``: the file's size)."""


def plain_read(path: Path, size: int) -> None:
    """A plain read to the end with ``readinto`` into one preallocated buffer (untimed):
    ``BENCH_READ_BUFFER`` names its size (a key of :data:`READ_BUFFERS`; default 8M)."""
    n = READ_BUFFERS[os.environ.get("BENCH_READ_BUFFER", "8M")] or size
    buf = bytearray(n)
    with timed(), open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def _drop_cache(path: Path) -> None:
    """Evict the file's pages (clean pages: ``posix_fadvise(DONTNEED)`` after an fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def plain_read_cold(path: Path, size: int) -> None:
    """``plain_read`` after the file's pages were evicted from the page cache."""
    _drop_cache(path)
    plain_read(path, size)


def xxh3_memory(path: Path, size: int) -> None:
    """xxh3_128 of ``size`` bytes already in memory: the hash's own limit on this CPU."""
    import xxhash

    data = bytearray(os.urandom(CHUNK)) * (size // CHUNK)
    with timed():
        xxhash.xxh3_128(data).digest()


def _scrub_roots(path: Path) -> tuple[Path, Path]:
    """The primary and the mirror of the scrub suite's store at ``path`` (``benchmarks.scrub``)."""
    return path / "primary", path / "mirror"


def _scrub_copies(path: Path) -> list[Path]:
    """The artifact files of the scrub suite's primary and mirror; with ``BENCH_COLD=1`` their
    pages are evicted first (untimed), as a scrub of data not read lately finds them."""
    files = [
        f
        for root in _scrub_roots(path)
        for f in sorted(root.rglob("*"))
        if f.is_file() and not f.relative_to(root).parts[0].startswith(".commitstore")
    ]
    if os.environ.get("BENCH_COLD") == "1":
        for f in files:
            _drop_cache(f)
    return files


def read_copies(path: Path, size: int) -> None:
    """Baseline: a plain read (``readinto``, one 8 MiB buffer) of every artifact file on the
    scrub suite's primary and mirror, the copies a scrub verifies."""
    buf = bytearray(8 << 20)
    files = _scrub_copies(path)
    with timed():
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass


def scrub_copies(path: Path, size: int) -> None:
    """commitstore: ``scrub()`` of the scrub suite's primary and mirror (every copy, in full)."""
    primary, mirror = _scrub_roots(path)
    store = open_store(str(primary), mirrors=[str(mirror)])
    _scrub_copies(path)
    with timed():
        report = store.scrub()
    assert report.ok and report.complete, report


def verify_full(path: Path, size: int) -> None:
    store = open_store(path.parent)
    store.record(path.name)  # set-up: the store is open and its record folder looked up
    with timed():
        report = store.verify(path.name, level="full")
    assert report.ok, report


def verify_full_cold(path: Path, size: int) -> None:
    """``verify_full`` after the file's pages were evicted from the page cache."""
    _drop_cache(path)
    verify_full(path, size)


PATH_OPS = {
    f.__name__: f
    for f in (
        naive_write,
        dd_direct,
        fio_direct,
        direct_writes,
        stage_commit,
        naive_small,
        small_floor,
        small_commit,
        stage_commit_no_writeback,
        bridge_commit_no_readback,
        plain_read,
        plain_read_cold,
        xxh3_memory,
        verify_full,
        verify_full_cold,
        commit_set_without_mirrors,
        commit_set_with_mirrors,
        sync_to_mirrors,
        rclone_copy_checksum,
        rclone_copy_checksum_parallel,
        read_copies,
        scrub_copies,
    )
}
URL_OPS = {
    f.__name__: f
    for f in (
        smb_commit,
        smb_commit_readback,
        smb_raw_write,
        s3_put_file,
        s3fs_put_file,
        s3fs_put_file_like_ours,
        s3_resume,
        s3fs_get_file,
        rclone_copyto,
        rclone_copyto_fast,
        gcs_put_file,
        gcsfs_put_file,
        gcsfs_put_file_fast,
    )
}


def main() -> None:
    op, target, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t0 = time.perf_counter()
    result = URL_OPS[op](target, size) if op in URL_OPS else PATH_OPS[op](Path(target), size)
    # An op times its measured part with timed(), or measures and returns it itself (what blocks
    # the caller); an op with neither is timed whole (after imports).
    if isinstance(result, float):
        seconds = result
    elif _clock:
        seconds = sum(_clock)
    else:
        seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "maxrss_kib": rss}))


if __name__ == "__main__":
    main()
