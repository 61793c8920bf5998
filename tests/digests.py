"""Comparing large objects by digest: a failed ``a == b`` on megabytes makes pytest diff them (difflib is
quadratic: the suite looks frozen); a digest comparison fails at once with both digests in the message."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(data: bytes | str | Path) -> str:
    """The sha256 hex digest of bytes, of a string (UTF-8) or of a file's content."""
    if isinstance(data, Path):
        data = data.read_bytes()
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def assert_same_digest(got: bytes | str | Path, expected: bytes | str | Path, what: str, hint: str = "") -> None:
    """Assert that ``got`` and ``expected`` have the same sha256; the message names ``what`` and both
    digests (and ``hint``, what to do about it). Never hands pytest the objects themselves to diff."""
    got_digest, expected_digest = sha256_of(got), sha256_of(expected)
    same = got_digest == expected_digest
    assert same, f"{what} differ: sha256 {got_digest} (got) vs {expected_digest} (expected). {hint}".rstrip()
