#!/usr/bin/env python3
"""A registry token server for tests/it/images.rs (Docker token auth, as the
CNCF distribution server's `auth: token:` expects it).

GET /token?service=S&scope=repository:NAME:ACTIONS[&scope=...] with HTTP
basic credentials: the right user and password get a JWT signed RS256 (by
`openssl dgst -sha256 -sign`, the stdlib has no RSA) whose `x5c` header
carries the self-signed certificate the registry has as its
`rootcertbundle`; anything else gets a 401. Every decision is appended to
the log file as one JSON line (what the test checks it was asked).

Usage: token_server.py KEY.pem CERT.pem ISSUER SERVICE USER PASSWORD LOG
Prints the port it listens on (127.0.0.1) as its first stdout line.
"""

import base64
import json
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

KEY, CERT, ISSUER, SERVICE, USER, PASSWORD, LOG = sys.argv[1:8]
LOCK = threading.Lock()


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def cert_der_b64():
    with open(CERT) as f:
        pem = f.read()
    body = pem.split("-----BEGIN CERTIFICATE-----")[1].split("-----END CERTIFICATE-----")[0]
    return "".join(body.split())  # standard base64 of the DER, as x5c wants


X5C = cert_der_b64()


def sign(data):
    out = subprocess.run(
        ["openssl", "dgst", "-sha256", "-sign", KEY],
        input=data,
        capture_output=True,
        check=True,
    )
    return out.stdout


def access_for(scopes):
    access = []
    for s in scopes:
        parts = s.split(":")
        if len(parts) < 3 or parts[0] != "repository":
            continue
        name = ":".join(parts[1:-1])
        actions = [a for a in parts[-1].split(",") if a in ("pull", "push")]
        access.append({"type": "repository", "name": name, "actions": actions})
    return access


def token(sub, access):
    now = int(time.time())
    header = {"typ": "JWT", "alg": "RS256", "x5c": [X5C]}
    claims = {
        "iss": ISSUER,
        "sub": sub,
        "aud": SERVICE,
        "exp": now + 300,
        "nbf": now - 10,
        "iat": now,
        "jti": uuid.uuid4().hex,
        "access": access,
    }
    signing_input = (
        b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(claims, separators=(",", ":")).encode())
    )
    return signing_input + "." + b64url(sign(signing_input.encode()))


def log(entry):
    with LOCK, open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        scopes = q.get("scope", [])
        if url.path != "/token":
            return self.reply(404, {"error": "not found"})
        user = None
        h = self.headers.get("Authorization", "")
        if h.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(h[6:]).decode().partition(":")
            except Exception:
                user, password = None, None
        if user != USER or password != PASSWORD:
            log({"granted": False, "user": user, "scopes": scopes})
            return self.reply(
                401,
                {"errors": [{"code": "UNAUTHORIZED", "message": "token server: bad credentials"}]},
                [("WWW-Authenticate", 'Basic realm="token"')],
            )
        if q.get("service", [SERVICE])[0] != SERVICE:
            log({"granted": False, "user": user, "scopes": scopes, "service": q["service"][0]})
            return self.reply(400, {"errors": [{"code": "DENIED", "message": "unknown service"}]})
        access = access_for(scopes)
        t = token(user, access)
        log({"granted": True, "user": user, "scopes": scopes, "access": access})
        self.reply(
            200,
            {
                "token": t,
                "access_token": t,
                "expires_in": 300,
                "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
