"""Backdoors: read and damage a store's target directly, never through the API under test."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol

import fsspec


class Backdoor(Protocol):
    """Raw access to a store's root. Paths are relative to the root, ``/``-separated."""

    def read(self, rel: str) -> bytes | None:
        """The bytes at ``rel``, or None if there is no file."""

    def write(self, rel: str, data: bytes) -> None:
        """Write ``data`` at ``rel`` directly (to simulate damage or foreign files)."""

    def remove(self, rel: str) -> None:
        """Delete the file at ``rel``."""

    def files(self) -> list[str]:
        """Every file below the root, hidden ones included, sorted."""

    def is_dir(self, rel: str) -> bool:
        """True if ``rel`` is a folder."""


class LocalBackdoor:
    """``os`` calls on a local folder."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def read(self, rel: str) -> bytes | None:
        p = self.root / rel
        return p.read_bytes() if p.is_file() else None

    def write(self, rel: str, data: bytes) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "r+b" if p.exists() else "wb") as f:
            f.write(data)
            f.truncate(len(data))

    def remove(self, rel: str) -> None:
        os.unlink(self.root / rel)

    def files(self) -> list[str]:
        out = []
        for dirpath, _dirs, fnames in os.walk(self.root):
            for f in fnames:
                out.append(
                    os.path.relpath(os.path.join(dirpath, f), self.root).replace(os.sep, "/")
                )
        return sorted(out)

    def is_dir(self, rel: str) -> bool:
        return (self.root / rel).is_dir()


class FsspecBackdoor:
    """Raw fsspec calls (a fresh filesystem instance, not the store's)."""

    def __init__(self, protocol: str, root: str, **options: object) -> None:
        self.fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
        self.root = root.rstrip("/")

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def read(self, rel: str) -> bytes | None:
        try:
            data = self.fs.cat_file(self._p(rel))
        except (FileNotFoundError, IsADirectoryError):
            return None
        return bytes(data)

    def write(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(self._p(rel), data)

    def remove(self, rel: str) -> None:
        self.fs.rm_file(self._p(rel))

    def files(self) -> list[str]:
        try:
            found = self.fs.find(self.root, withdirs=False)
        except FileNotFoundError:
            return []
        prefix = self.root.lstrip("/") + "/"
        return sorted(str(p).lstrip("/")[len(prefix) :] for p in found)

    def is_dir(self, rel: str) -> bool:
        return bool(self.fs.isdir(self._p(rel)))


class S3Backdoor:
    """boto3 calls on a bucket prefix (the server's own client, not s3fs)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def _k(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def read(self, rel: str) -> bytes | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._k(rel))["Body"]
        except self.client.exceptions.NoSuchKey:
            return None
        except Exception as exc:  # some servers answer a bare 404
            if "404" in str(exc) or "NoSuchKey" in str(exc):
                return None
            raise
        data: bytes = body.read()
        return data

    def write(self, rel: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._k(rel), Body=data)

    def remove(self, rel: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._k(rel))

    def files(self) -> list[str]:
        out: list[str] = []
        prefix = f"{self.prefix}/" if self.prefix else ""
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        ):
            out.extend(obj["Key"][len(prefix) :] for obj in page.get("Contents", []))
        return sorted(out)

    def is_dir(self, rel: str) -> bool:
        page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._k(rel) + "/", MaxKeys=1)
        return bool(page.get("Contents"))

    def pending_uploads(self) -> list[dict[str, Any]]:
        """Multipart uploads not completed nor aborted, under the prefix."""
        try:
            res = self.client.list_multipart_uploads(
                Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else ""
            )
        except Exception as exc:  # rclone answers NoSuchUpload when there are none
            if "NoSuchUpload" in str(exc):
                return []
            raise
        uploads: list[dict[str, Any]] = res.get("Uploads", [])
        return uploads

    def parts_uploaded(self, key: str, upload_id: str) -> int:
        """How many parts an unfinished upload has received."""
        rel = f"{self.prefix}/{key}" if self.prefix and not key.startswith(self.prefix) else key
        res = self.client.list_parts(Bucket=self.bucket, Key=rel, UploadId=upload_id)
        return len(res.get("Parts", []))

    def last_activity(self, upload: dict[str, Any]) -> float:
        """The newest of an unfinished upload's start, its parts' times and its writer's
        marker's (``.commitstore/uploads/<id>``), as the server reports them; 0.0 once the
        upload is gone."""
        key, upload_id = str(upload["Key"]), str(upload["UploadId"])
        times = [upload["Initiated"].timestamp()]
        try:
            page = self.client.list_parts(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except Exception as exc:  # completed or aborted meanwhile
            if "NoSuchUpload" in str(exc) or "404" in str(exc):
                return 0.0
            raise
        times += [p["LastModified"].timestamp() for p in page.get("Parts", [])]
        marker = self._k(f".commitstore/uploads/{upload_id.replace('/', '_')}")
        try:
            times.append(
                self.client.head_object(Bucket=self.bucket, Key=marker)["LastModified"].timestamp()
            )
        except Exception as exc:  # no marker: its writer removed it, or never wrote it
            if (
                "404" not in str(exc)
                and "NoSuchKey" not in str(exc)
                and "Not Found" not in str(exc)
            ):
                raise
        return float(max(times))

    def wait_dead(self, key: str, limit: float, timeout: float = 120.0) -> None:
        """Wait until every unfinished upload of ``key`` (under the prefix, or the bucket key)
        looks dead to a resuming writer: no activity for more than ``limit`` seconds by this
        clock (``STALE_BEATS`` heartbeats plus the store's mtime resolution). Raises
        AssertionError when one still looks live after ``timeout`` seconds."""
        full = key if self.prefix and key.startswith(f"{self.prefix}/") else self._k(key)
        deadline = time.monotonic() + timeout
        while True:
            live = [
                u
                for u in self.pending_uploads()
                if u["Key"] == full and time.time() - self.last_activity(u) <= limit
            ]
            if not live:
                return
            assert time.monotonic() < deadline, f"{full}: an upload still looks live"
            time.sleep(0.1)


class GcsBackdoor:
    """Raw GCS JSON-API calls over ``urllib`` (independent of gcsfs and of commitstore) on a
    bucket prefix of a GCS-compatible endpoint without authentication (fake-gcs-server)."""

    def __init__(self, endpoint: str, bucket: str, prefix: str) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.bucket = bucket
        self.prefix = prefix

    def _request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        import urllib.request

        req = urllib.request.Request(self.endpoint + path, data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/octet-stream")
        with urllib.request.urlopen(req, timeout=30) as resp:
            data: bytes = resp.read()
            return data

    def _k(self, rel: str) -> str:
        from urllib.parse import quote

        return quote(f"{self.prefix}/{rel}", safe="")

    def _list(self, prefix: str, extra: str = "") -> list[dict[str, Any]]:
        import json
        from urllib.parse import quote

        items: list[dict[str, Any]] = []
        token = ""
        while True:
            q = f"prefix={quote(prefix, safe='')}{extra}" + (f"&pageToken={token}" if token else "")
            doc = json.loads(self._request("GET", f"/storage/v1/b/{self.bucket}/o?{q}"))
            items += doc.get("items", [])
            token = doc.get("nextPageToken", "")
            if not token or extra:
                return items

    def read(self, rel: str) -> bytes | None:
        import urllib.error

        try:
            return self._request("GET", f"/storage/v1/b/{self.bucket}/o/{self._k(rel)}?alt=media")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def write(self, rel: str, data: bytes) -> None:
        path = f"/upload/storage/v1/b/{self.bucket}/o?uploadType=media&name={self._k(rel)}"
        self._request("POST", path, data)

    def remove(self, rel: str) -> None:
        self._request("DELETE", f"/storage/v1/b/{self.bucket}/o/{self._k(rel)}")

    def files(self) -> list[str]:
        n = len(self.prefix) + 1
        names = [i["name"][n:] for i in self._list(self.prefix + "/")]
        return sorted(f for f in names if not f.endswith("/"))

    def is_dir(self, rel: str) -> bool:
        return bool(self._list(f"{self.prefix}/{rel}/", "&maxResults=1"))


class AzureBackdoor:
    """azure-storage-blob calls (the service's own client, independent of commitstore) on a
    prefix of one container (``ContainerClient``)."""

    def __init__(self, container: Any, prefix: str) -> None:
        self.container = container
        self.prefix = prefix

    def _k(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"

    def read(self, rel: str) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            data: bytes = self.container.get_blob_client(self._k(rel)).download_blob().readall()
        except ResourceNotFoundError:
            return None
        return data

    def write(self, rel: str, data: bytes) -> None:
        self.container.get_blob_client(self._k(rel)).upload_blob(data, overwrite=True)

    def remove(self, rel: str) -> None:
        self.container.get_blob_client(self._k(rel)).delete_blob()

    def files(self) -> list[str]:
        n = len(self.prefix) + 1
        names = self.container.list_blobs(name_starts_with=self.prefix + "/")
        return sorted(b.name[n:] for b in names if not b.name.endswith("/"))

    def is_dir(self, rel: str) -> bool:
        return any(True for _ in self.container.list_blobs(name_starts_with=self._k(rel) + "/"))
