"""Where retention archives a session before deleting anything of it: a directory, or an
object store that speaks S3's API (AWS S3, MinIO, Ceph, R2, ...).

The archive is the session's export file (sessions_app.upkeep.transfer). An archive write either
completes, confirmed, or raises ArchiveError, and then nothing of the session is deleted:
- a directory: written to a temporary file, flushed to disk (fsync), then renamed;
- an object store: one PUT with the body's MD5 (the store refuses a body that arrived
  different), then a HEAD that must report the same size.

An `s3://bucket/prefix` archive is signed with AWS Signature Version 4 from the standard
variables: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (or ..._FILE), AWS_SESSION_TOKEN,
AWS_REGION; RESPAWN_ARCHIVE_S3_ENDPOINT names a store other than AWS (path-style URLs).
No SDK is needed: the standard library's HTTP client and the signing below.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

Writer = Callable[[IO[bytes]], Any]  # writes the export file to a binary stream


class ArchiveError(Exception):
    """The archive could not be written (or not confirmed): nothing is deleted."""


class Archive(Protocol):
    """Where retention writes a session's export before deleting it: a directory or an
    S3 bucket. `str()` names it for messages."""

    def problem(self) -> str | None:
        """Why it cannot be written to, found without writing; None if none is known."""
        ...

    def write(self, key: str, write: Writer) -> str:
        """Store what `write` writes under `key`, confirmed; returns where it went."""
        ...


class DirectoryArchive:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __str__(self) -> str:
        return str(self.directory)

    def problem(self) -> str | None:
        if self.directory.exists() and not self.directory.is_dir():
            return f"archive_dir {self.directory} is not a directory"
        return None

    def write(self, key: str, write: Writer) -> str:
        target = self.directory / key
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                dir=target.parent, delete=False, suffix=".part"
            ) as tmp:
                write(tmp)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.replace(tmp.name, target)
        except OSError as exc:
            raise ArchiveError(f"cannot write {target}: {exc.strerror or exc}") from None
        return str(target)


# --- AWS Signature Version 4 --------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def sign_v4(
    *,
    method: str,
    url: str,
    headers: dict[str, str],
    payload_hash: str,
    access_key: str,
    secret_key: str,
    region: str,
    service: str,
    now: datetime,
) -> dict[str, str]:
    """`headers` with the X-Amz-Date and Authorization headers of Signature Version 4 (the
    caller includes x-amz-content-sha256 for S3, and X-Amz-Security-Token if it has one)."""
    parts = urllib.parse.urlsplit(url)
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    signed = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    signed["host"] = parts.netloc
    signed["x-amz-date"] = stamp
    names = sorted(signed)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query))
    path = "/".join(_quote(urllib.parse.unquote(p)) for p in (parts.path or "/").split("/"))
    canonical = "\n".join(
        [
            method,
            path,
            canonical_query,
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            payload_hash,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, _sha256(canonical.encode())])
    key = _hmac(("AWS4" + secret_key).encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = dict(headers)
    out["X-Amz-Date"] = stamp
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out


# --- An S3-compatible object store ----------------------------------------------------------

S3_URL = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$")


@dataclass(frozen=True)
class S3Credentials:
    access_key: str
    secret_key: str
    session_token: str = ""
    region: str = "us-east-1"
    endpoint: str = ""  # "" : AWS itself


class S3Archive:
    def __init__(self, url: str, credentials: S3Credentials, timeout: float = 60.0) -> None:
        match = S3_URL.match(url)
        if match is None:
            raise ArchiveError(f"archive_dir {url!r} is not s3://bucket[/prefix]")
        self.url = url
        self.bucket = match["bucket"]
        self.prefix = (match["prefix"] or "").strip("/")
        self.credentials = credentials
        self.timeout = timeout
        endpoint = credentials.endpoint.rstrip("/")
        self.base = endpoint or f"https://s3.{credentials.region}.amazonaws.com"

    def __str__(self) -> str:
        return self.url

    def problem(self) -> str | None:
        if not (self.credentials.access_key and self.credentials.secret_key):
            return (
                f"archive_dir {self.url} needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or their _FILE variants)"
            )
        return None

    def _object_url(self, key: str) -> str:
        path = "/".join(_quote(p) for p in f"{self.bucket}/{key}".split("/"))
        return f"{self.base}/{path}"

    def _request(
        self, method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        headers = dict(headers or {})
        payload_hash = _sha256(body)
        headers["x-amz-content-sha256"] = payload_hash
        if self.credentials.session_token:
            headers["X-Amz-Security-Token"] = self.credentials.session_token
        signed = sign_v4(
            method=method,
            url=url,
            headers=headers,
            payload_hash=payload_hash,
            access_key=self.credentials.access_key,
            secret_key=self.credentials.secret_key,
            region=self.credentials.region,
            service="s3",
            now=datetime.now(UTC),
        )
        request = urllib.request.Request(url, data=body or None, method=method, headers=signed)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:2000].decode(errors="replace")
            code = re.search(r"<Code>([^<]+)</Code>", detail)
            message = re.search(r"<Message>([^<]+)</Message>", detail)
            said = ": ".join(m.group(1) for m in (code, message) if m) or exc.reason
            raise ArchiveError(f"{method} {url}: {exc.code} {said}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ArchiveError(f"{method} {url}: {reason}") from None

    def write(self, key: str, write: Writer) -> str:
        buffer = io.BytesIO()
        write(buffer)
        body = buffer.getvalue()
        full_key = f"{self.prefix}/{key}" if self.prefix else key
        url = self._object_url(full_key)
        md5 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
        self._request(
            "PUT",
            url,
            body,
            {"Content-Type": "application/gzip", "Content-MD5": md5},
        )
        _, headers, _ = self._request("HEAD", url)
        size = {k.lower(): v for k, v in headers.items()}.get("content-length")
        if size != str(len(body)):
            raise ArchiveError(
                f"HEAD {url}: the store holds {size} bytes, {len(body)} were written"
            )
        return f"s3://{self.bucket}/{full_key}"


def archive_for(location: str, environ: Mapping[str, str] | None = None) -> Archive:
    """The archive `location` names: `s3://bucket/prefix` or a directory path."""
    if location.startswith("s3://"):
        env = os.environ if environ is None else environ
        return S3Archive(
            location,
            S3Credentials(
                access_key=_secret(env, "AWS_ACCESS_KEY_ID"),
                secret_key=_secret(env, "AWS_SECRET_ACCESS_KEY"),
                session_token=_secret(env, "AWS_SESSION_TOKEN"),
                region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
                endpoint=env.get("RESPAWN_ARCHIVE_S3_ENDPOINT", ""),
            ),
        )
    return DirectoryArchive(Path(location))


def _secret(env: Mapping[str, str], name: str) -> str:
    path = env.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ArchiveError(f"{name}_FILE={path!r} cannot be read: {exc.strerror}") from None
    return env.get(name, "")
