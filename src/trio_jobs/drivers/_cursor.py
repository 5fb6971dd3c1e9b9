"""Keyset cursors over ``(created_at, id)``, shared by every driver's ``list``."""

from __future__ import annotations

import base64
import hashlib

import orjson

from ..errors import ErrorCode, JobsError

__all__ = ["decode_cursor", "encode_cursor"]

_CURSOR_SALT = b"trio-jobs-cursor-v1"


def encode_cursor(created_at: float, job_id: str) -> str:
    """A keyset cursor over ``(created_at, id)``, checksummed so a hand-made one is refused."""
    body = orjson.dumps([created_at, job_id])
    mac = hashlib.blake2s(body, key=_CURSOR_SALT, digest_size=6).digest()
    return base64.urlsafe_b64encode(mac + body).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        mac, body = raw[:6], raw[6:]
        if hashlib.blake2s(body, key=_CURSOR_SALT, digest_size=6).digest() != mac:
            raise ValueError("checksum")
        created_at, job_id = orjson.loads(body)
        return float(created_at), str(job_id)
    except (ValueError, TypeError, orjson.JSONDecodeError):
        raise JobsError(
            ErrorCode.X_JOB_PAGE_INVALID,
            "that cursor was not produced by a page; pass .after or .before from a JobPage",
        ) from None
