"""The block IDs of Azure uploads and the state of one a later process may resume.

Every block is staged with ``Content-MD5``, which the server checks against the body, under the
ID :func:`block_id` makes of its part number and that MD5: an ID the server lists as staged names
exactly the bytes it holds (the ID's MD5) and their place, so a later attempt can tell, from
``Get Block List`` alone, which blocks it may commit again. The IDs are 28 characters (21 bytes,
base64), the length writer-unique IDs had, since the server refuses a blob's blocks of mixed ID
lengths.

A sink offered a local file to send in blocks keeps at ``layout.resume_parts(name)`` on the
target the state of its upload (:class:`AzureResumeState`, read and checked as every store's:
``resume.UploadState``): the name, the blob, the block size, the source's identity
(``resume.source_identity``) and the ID of each block the server took. It is only a pointer: a
state that does not parse, names another name, blob, block size or source, is dropped and the
upload starts over; a block is reused only when the server lists it under the
ID and with the size of the very bytes written this time (and the state gives that part no other
ID). The ``Put Block List`` of the IDs of the bytes written stays the commit.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, ClassVar

from commitstore.backends.object.resume import UploadState, numbered

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
class AzureResumeState(UploadState):
    """One upload's state, as stored (:meth:`to_bytes`: the key as ``blob``, the part size as
    ``block_size``) and as parsed (:meth:`parse`: None when it is not a well-formed state:
    garbage, another schema, a field of the wrong type, a block ID that is not one
    :func:`block_id` makes for the part number it is listed under)."""

    schema: ClassVar[str] = SCHEMA
    key_field: ClassVar[str] = "blob"
    size_field: ClassVar[str] = "block_size"
    name: str
    key: str
    """The blob."""
    part_size: int
    """The block size."""
    source: dict[str, Any]
    blocks: dict[int, str] = field(default_factory=dict)
    """Part number -> ID (:func:`block_id`) of the block the server took."""

    def fields(self) -> dict[str, Any]:
        return {"blocks": {str(n): ident for n, ident in sorted(self.blocks.items())}}

    @classmethod
    def from_doc(
        cls, doc: dict[str, Any], name: str, key: str, part_size: int, source: dict[str, Any]
    ) -> AzureResumeState | None:
        blocks = numbered(doc.get("blocks"), _names_block)
        return None if blocks is None else cls(name, key, part_size, source, blocks)


def _names_block(number: int, ident: str) -> bool:
    """Whether ``ident`` is an ID :func:`block_id` makes for part ``number``."""
    found = block_of(ident)
    return found is not None and found[0] == number
