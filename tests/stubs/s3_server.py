"""A local object store that speaks the part of S3's REST API retention uses (PUT, HEAD,
GET of an object, path-style), and checks what S3 checks: the Signature Version 4 of
every request (recomputed from the request as received), the x-amz-content-sha256 and
Content-MD5 of a body. A test can make it refuse (`fail_with`)."""

from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import unquote, urlsplit

from sessions_app.upkeep.archive import sign_v4

from .loopback import QuietHandler, loopback_server, serve_in_background

ERROR = "<?xml version='1.0'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<day>\d{8})/(?P<region>[^/]+)/s3/"
    r"aws4_request, SignedHeaders=(?P<signed>[^,]+), Signature=(?P<signature>[0-9a-f]{64})"
)


class S3Stub:
    def __init__(self, access_key: str, secret_key: str, region: str = "us-east-1") -> None:
        self.access_key, self.secret_key, self.region = access_key, secret_key, region
        self.objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail_with: tuple[int, str, str] | None = None
        stub = self

        class Handler(QuietHandler):
            def _error(self, status: int, code: str, message: str) -> None:
                body = ERROR.format(code=code, message=message).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _checked(self, body: bytes) -> str | None:
                """The object key, or None after answering with S3's refusal."""
                stub.requests.append((self.command, self.path))
                if stub.fail_with is not None:
                    self._error(*stub.fail_with)
                    return None
                match = AUTH.fullmatch(self.headers.get("Authorization", ""))
                if match is None or match["key"] != stub.access_key:
                    self._error(403, "InvalidAccessKeyId", "no such access key")
                    return None
                digest = hashlib.sha256(body).hexdigest()
                if self.headers.get("x-amz-content-sha256") != digest:
                    self._error(400, "XAmzContentSHA256Mismatch", "the body's hash differs")
                    return None
                names = match["signed"].split(";")
                headers = {n: self.headers[n] for n in names if n not in ("host", "x-amz-date")}
                from datetime import UTC, datetime

                stamp = datetime.strptime(self.headers["x-amz-date"], "%Y%m%dT%H%M%SZ")
                url = f"http://{self.headers['host']}{self.path}"
                expected = sign_v4(
                    method=self.command,
                    url=url,
                    headers=headers,
                    payload_hash=digest,
                    access_key=stub.access_key,
                    secret_key=stub.secret_key,
                    region=stub.region,
                    service="s3",
                    now=stamp.replace(tzinfo=UTC),
                )
                if expected["Authorization"] != self.headers["Authorization"]:
                    self._error(403, "SignatureDoesNotMatch", "the signature does not match")
                    return None
                return unquote(urlsplit(self.path).path.lstrip("/"))

            def do_PUT(self):  # noqa: N802 - the http.server interface
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self._checked(body)
                if key is None:
                    return
                md5 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest())
                if self.headers.get("Content-MD5", "").encode() != md5:
                    self._error(400, "BadDigest", "the Content-MD5 does not match the body")
                    return
                stub.objects[key] = body
                self.send_response(200)
                self.send_header(
                    "ETag", f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'
                )
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self):  # noqa: N802
                key = self._checked(b"")
                if key is None:
                    return
                if key not in stub.objects:
                    self._error(404, "NoSuchKey", "no such key")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(stub.objects[key])))
                self.end_headers()

        self.server = serve_in_background(loopback_server(Handler))
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
