"""The block IDs of Azure uploads and the state of one a later process may resume.

Every block is staged with ``Content-MD5``, which the server checks against the body, under the
ID :func:`block_id` makes of its part number and that MD5: an ID the server lists as staged names
exactly the bytes it holds (the ID's MD5) and their place, so a later attempt can tell, from
``Get Block List`` alone, which blocks it may commit again. The IDs are 28 characters (21 bytes,
base64), the length writer-unique IDs had, since the server refuses a blob's blocks of mixed ID
lengths.

A sink offered a local file to send in blocks keeps at ``layout.resume_parts(name)`` on the
target the state of its upload (:class:`AzureResumeState`): the name, the blob, the block size,
the source's identity (``resume.source_identity``) and the ID of each block the server took. It
is only a pointer: a state that does not parse, names another name, blob, block size or source,
is dropped and the upload starts over; a block is reused only when the server lists it under the
ID and with the size of the very bytes written this time (and the state gives that part no other
ID). The ``Put Block List`` of the IDs of the bytes written stays the commit.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "commitstore.resume.azure/1"
MAX_BLOCKS = 50_000
_MARK = b"cs"
_ID_BYTES = len(_MARK) + 3 + 16


def block_id(number: int, md5: bytes) -> str:
    """The ID of block ``number`` (from 1) whose bytes have MD5 ``md5`` (16 bytes)."""
    assert 1 <= number <= MAX_BLOCKS and len(md5) == 16, (number, md5)
    return base64.b64encode(_MARK + number.to_bytes(3, "big") + md5).decode("ascii")


def block_of(ident: str) -> tuple[int, bytes] | None:
    """(part number, MD5) of an ID :func:`block_id` made, or None for any other string."""
    try:
        raw = base64.b64decode(ident.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None
    if len(raw) != _ID_BYTES or raw[: len(_MARK)] != _MARK:
        return None
    if base64.b64encode(raw).decode("ascii") != ident:
        return None
    number = int.from_bytes(raw[len(_MARK) : len(_MARK) + 3], "big")
    if not 1 <= number <= MAX_BLOCKS:
        return None
    return number, raw[len(_MARK) + 3 :]


@dataclass
class AzureResumeState:
    """One upload's state, as stored (:meth:`to_bytes`) and as parsed (:func:`parse`)."""

    name: str
    blob: str
    block_size: int
    source: dict[str, Any]
    blocks: dict[int, str] = field(default_factory=dict)
    """Part number -> ID (:func:`block_id`) of the block the server took."""

    def to_bytes(self) -> bytes:
        doc = {
            "schema": SCHEMA,
            "name": self.name,
            "blob": self.blob,
            "block_size": self.block_size,
            "source": self.source,
            "blocks": {str(n): ident for n, ident in sorted(self.blocks.items())},
        }
        return json.dumps(doc, sort_keys=True).encode("utf-8")


def parse(data: bytes) -> AzureResumeState | None:
    """The state in ``data``, or None when it is not a well-formed state (garbage, another
    schema, a field of the wrong type, a block ID that is not one :func:`block_id` makes for
    the part number it is listed under)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    name, blob, size = doc.get("name"), doc.get("blob"), doc.get("block_size")
    source, blocks = doc.get("source"), doc.get("blocks")
    if not (isinstance(name, str) and name and isinstance(blob, str) and blob):
        return None
    if type(size) is not int or size <= 0 or not isinstance(source, dict):
        return None
    if not isinstance(blocks, dict):
        return None
    numbered: dict[int, str] = {}
    for number, ident in blocks.items():
        if not (isinstance(number, str) and number.isdigit() and isinstance(ident, str)):
            return None
        found = block_of(ident)
        if found is None or found[0] != int(number):
            return None
        numbered[int(number)] = ident
    return AzureResumeState(name, blob, size, source, numbered)
