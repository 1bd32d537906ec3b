"""Local HTTPS servers on 127.0.0.1 that stand in for the hosts the proxy's
credentials are for: a test CA and its certificates, an API upstream
(tls_upstream.js, HTTP/2 and HTTP/1.1) and private package hosts (PyPI, npm,
git, cargo) under .test names. The proxy is pointed at 127.0.0.1 for those
names and told to trust TestCA.ca_pem."""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import ipaddress
import json
import os
import pathlib
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HERE = pathlib.Path(__file__).resolve().parent
DOMAIN = "creds.test"
LOOPBACK = ipaddress.ip_address("127.0.0.1")

Key = ec.EllipticCurvePrivateKey


def _builder(subject: str, issuer: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False))


def _usage(**on: bool) -> x509.KeyUsage:
    names = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
             "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
    return x509.KeyUsage(**{n: on.get(n, False) for n in names})


def _root(name: str) -> tuple[Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (_builder(name, issuer, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_usage(digital_signature=True, key_cert_sign=True, crl_sign=True), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


class TestCA:
    """A root CA (EC P-256) kept in `directory`, by default a new temporary
    one that close() removes; `ca_pem` is its certificate, the one to trust."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: pathlib.Path | None = None) -> None:
        self._owned = directory is None
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="nsm-ca-")) if directory is None else directory
        self._key, self._cert = _root("nsm-sandbox-mcp test CA")
        self._untrusted = _root("untrusted test CA")
        self._issued = 0
        self.ca_pem = self.directory / "ca.pem"
        self.ca_pem.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, names: list[str]) -> tuple[pathlib.Path, pathlib.Path]:
        """A server certificate from this CA for DNS `names` and IP 127.0.0.1: (cert PEM, key PEM)."""
        return self._issue(self._key, self._cert, names, ip=True)

    def issue_untrusted(self, names: list[str]) -> tuple[pathlib.Path, pathlib.Path]:
        """Like issue(), but signed by another CA that nothing trusts."""
        return self._issue(*self._untrusted, names, ip=True)

    def issue_wrong_name(self) -> tuple[pathlib.Path, pathlib.Path]:
        """A certificate from this CA for wrong-name.test only (no IP address)."""
        return self._issue(self._key, self._cert, ["wrong-name.test"], ip=False)

    def _issue(self, ca_key: Key, ca_cert: x509.Certificate, names: list[str], ip: bool) -> tuple[pathlib.Path, pathlib.Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names] + ([x509.IPAddress(LOOPBACK)] if ip else [])
        cert = (_builder(names[0], ca_cert.subject, key.public_key())
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(_usage(digital_signature=True), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        self._issued += 1
        cert_path, key_path = self.directory / f"server-{self._issued}.pem", self.directory / f"server-{self._issued}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> TestCA:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ApiUpstream:
    """tls_upstream.js on 127.0.0.1 (HTTP/2 and HTTP/1.1) with the given
    certificate; its routes are listed at the top of that file. /private/...
    needs `authorization` as the exact Authorization header (None: always 401).
    With script="ws_upstream.js", a WebSocket host instead (see that file)."""

    def __init__(self, cert: pathlib.Path, key: pathlib.Path, authorization: str | None = None,
                 script: str = "tls_upstream.js") -> None:
        self._dir = pathlib.Path(tempfile.mkdtemp(prefix="nsm-upstream-"))
        self._log = self._dir / "requests.jsonl"
        self._log.touch()
        argv = ["node", str(HERE / script), str(cert), str(key), str(self._log)]
        with open(self._dir / "stderr", "wb") as stderr:
            self._proc = subprocess.Popen(argv + ([authorization] if authorization is not None else []),
                                          stdout=subprocess.PIPE, stderr=stderr)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.isdigit():
            self._proc.kill()
            self._proc.wait()
            why = (self._dir / "stderr").read_text(errors="replace")
            self.close()
            raise RuntimeError(f"{script} did not start: {why}")
        self.port = int(line)

    @staticmethod
    def pattern(n: int) -> bytes:
        """The body /bytes?n=N sends."""
        return bytes(range(251)) * (n // 251) + bytes(range(n % 251))

    def url(self, host: str = "127.0.0.1") -> str:
        """https://HOST:PORT, e.g. url("api.creds.test") for the proxied name."""
        return f"https://{host}:{self.port}"

    def requests(self) -> list[dict[str, Any]]:
        """Requests received so far, oldest first: {method, path, httpVersion ("1.1" or "2.0"),
        headers (lowercase names; HTTP/2 pseudo-headers included), body_bytes}."""
        return [json.loads(line) for line in self._log.read_text().splitlines()]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ApiUpstream:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _tgz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 1_600_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _wheel(files: dict[str, bytes], dist_info: str) -> bytes:
    files = {**files,
             f"{dist_info}/METADATA": b"Metadata-Version: 2.1\nName: nsm-demo\nVersion: 1.0\n",
             f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: stand-ins\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = f"{record}{dist_info}/RECORD,,\n".encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def _git(*args: str, cwd: pathlib.Path, stdin: str = "") -> str:
    env = {"PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_AUTHOR_NAME": "stand-in", "GIT_AUTHOR_EMAIL": "stand-in@creds.test",
           "GIT_COMMITTER_NAME": "stand-in", "GIT_COMMITTER_EMAIL": "stand-in@creds.test"}
    return subprocess.run(["git", *args], cwd=cwd, input=stdin, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


Answer = tuple[int, dict[str, str], bytes]


def _json(value: Any) -> Answer:
    return 200, {"Content-Type": "application/json"}, json.dumps(value).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: _TlsServer

    def setup(self) -> None:
        super().setup()
        cast(ssl.SSLSocket, self.connection).do_handshake()

    def do_GET(self) -> None:
        self.server.stand_ins._handle(self)

    do_POST = do_GET

    def log_message(self, *_: Any) -> None:
        pass


class _TlsServer(ThreadingHTTPServer):
    block_on_close = False

    def __init__(self, context: ssl.SSLContext, stand_ins: PackageStandIns) -> None:
        self.context, self.stand_ins = context, stand_ins
        super().__init__(("127.0.0.1", 0), _Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client that hangs up or refuses the certificate
            super().handle_error(request, client_address)


class PackageStandIns:
    """One HTTPS server (HTTP/1.1) on 127.0.0.1 standing in for four private
    package hosts, each serving one package, nsm-demo, whose code holds MARKS[kind]:
    pypi.creds.test (PEP 503 simple index of a wheel), npm.creds.test (npm
    registry), git.creds.test (git smart HTTP, repository demo.git) and
    cargo.creds.test (cargo sparse registry). The Host header picks the host;
    when it is 127.0.0.1 (direct use, without a resolver) the first path
    segment does: https://127.0.0.1:PORT/pypi/simple/ is
    https://pypi.creds.test:PORT/simple/. Links and URLs in answers are built
    from the request's Host, so both forms work. Every request must carry
    exactly `authorization` as its Authorization header (None: nothing is
    required), else it gets 401 with `WWW-Authenticate: Bearer`."""

    KINDS = ("pypi", "npm", "git", "cargo")
    MARKS = {"pypi": "from the private index", "npm": "from the private registry",
             "git": "from the private git server", "cargo": "from the private crate registry"}
    WHEEL = "nsm_demo-1.0-py3-none-any.whl"

    def __init__(self, ca: TestCA, authorization: str | None) -> None:
        self.authorization = authorization
        self._seen: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._dir = pathlib.Path(tempfile.mkdtemp(prefix="nsm-packages-"))
        self._make_repository()
        wheel = _wheel({"nsm_demo.py": f'VALUE = "{self.MARKS["pypi"]}"\n'.encode()}, "nsm_demo-1.0.dist-info")
        self._tgz = _tgz({"package/package.json": b'{"name": "nsm-demo", "version": "1.0.0", "main": "index.js"}\n',
                          "package/index.js": f'module.exports = "{self.MARKS["npm"]}";\n'.encode()})
        crate = _tgz({"nsm-demo-1.0.0/Cargo.toml": b'[package]\nname = "nsm-demo"\nversion = "1.0.0"\nedition = "2021"\n',
                      "nsm-demo-1.0.0/src/lib.rs": f'pub const VALUE: &str = "{self.MARKS["cargo"]}";\n'.encode()})
        index_entry = {"name": "nsm-demo", "vers": "1.0.0", "deps": [], "features": {}, "yanked": False,
                       "cksum": hashlib.sha256(crate).hexdigest()}
        page = '<!DOCTYPE html><html><body>{}</body></html>\n'
        self._files: dict[tuple[str, str], tuple[str, bytes]] = {
            ("pypi", "/simple/"): ("text/html", page.format('<a href="nsm-demo/">nsm-demo</a>').encode()),
            ("pypi", "/simple/nsm-demo/"): ("text/html", page.format(
                f'<a href="../../files/{self.WHEEL}#sha256={hashlib.sha256(wheel).hexdigest()}">{self.WHEEL}</a>').encode()),
            ("pypi", f"/files/{self.WHEEL}"): ("application/octet-stream", wheel),
            ("npm", "/nsm-demo/-/nsm-demo-1.0.0.tgz"): ("application/octet-stream", self._tgz),
            ("cargo", "/index/ns/m-/nsm-demo"): ("text/plain", json.dumps(index_entry).encode() + b"\n"),
            ("cargo", "/dl/nsm-demo/1.0.0/download"): ("application/octet-stream", crate),
        }
        cert, key = ca.issue([f"{kind}.{DOMAIN}" for kind in self.KINDS])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.set_alpn_protocols(["http/1.1"])
        self._server = _TlsServer(context, self)
        self.port: int = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self, kind: str, direct: bool = False) -> str:
        """The base URL of a stand-in, ending in "/": https://pypi.creds.test:PORT/
        (or, direct, https://127.0.0.1:PORT/pypi/). Under it: pypi `simple/` (pip
        --index-url), npm the registry itself (npm --registry), git `demo.git`,
        cargo `index/` (with "sparse+" in front, a cargo registry index)."""
        assert kind in self.KINDS
        return f"https://127.0.0.1:{self.port}/{kind}/" if direct else f"https://{kind}.{DOMAIN}:{self.port}/"

    def requests(self) -> list[dict[str, Any]]:
        """Requests received so far, oldest first: {host (no port), method, path
        (with query), authorization (whether the header was present), status}."""
        with self._lock:
            return list(self._seen)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PackageStandIns:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _make_repository(self) -> None:
        repo = self._dir / "demo.git"
        _git("init", "-q", "--bare", "-b", "main", str(repo), cwd=self._dir)
        blob = _git("hash-object", "-w", "--stdin", cwd=repo, stdin=self.MARKS["git"] + "\n")
        tree = _git("mktree", cwd=repo, stdin=f"100644 blob {blob}\tREADME\n")
        _git("update-ref", "refs/heads/main", _git("commit-tree", tree, "-m", "demo", cwd=repo), cwd=repo)

    def _handle(self, request: _Handler) -> None:
        body = _read_body(request)
        host_port = request.headers.get("Host", "")
        host = host_port.rsplit(":", 1)[0].lower()
        path, _, query = request.path.partition("?")
        if host == str(LOOPBACK):
            kind, _, rest = path.lstrip("/").partition("/")
            path, base = "/" + rest, f"https://{host_port}/{kind}"
        else:
            kind, base = next((k for k in self.KINDS if host == f"{k}.{DOMAIN}"), ""), f"https://{host_port}"
        authorization = request.headers.get("Authorization")
        if self.authorization is not None and authorization != self.authorization:
            status, headers, payload = 401, {"WWW-Authenticate": "Bearer"}, b"authorization required\n"
        elif kind not in self.KINDS:
            status, headers, payload = 404, {}, b"no such host\n"
        else:
            status, headers, payload = self._answer(kind, request.command, path, query, request.headers, body, base)
        with self._lock:
            self._seen.append({"host": host, "method": request.command, "path": request.path,
                               "authorization": authorization is not None, "status": status})
        request.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(payload))}.items():
            request.send_header(name, value)
        request.end_headers()
        request.wfile.write(payload)

    def _answer(self, kind: str, method: str, path: str, query: str, headers: Message, body: bytes, base: str) -> Answer:
        if kind == "git":
            return self._git_backend(method, path, query, headers, body)
        if (kind, path) == ("npm", "/nsm-demo"):
            dist = {"tarball": f"{base}/nsm-demo/-/nsm-demo-1.0.0.tgz", "shasum": hashlib.sha1(self._tgz).hexdigest(),
                    "integrity": "sha512-" + base64.b64encode(hashlib.sha512(self._tgz).digest()).decode()}
            version = {"name": "nsm-demo", "version": "1.0.0", "main": "index.js", "dist": dist}
            return _json({"name": "nsm-demo", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}})
        if (kind, path) == ("cargo", "/index/config.json"):
            return _json({"dl": f"{base}/dl/{{crate}}/{{version}}/download", "api": base})
        if (kind, path) in self._files:
            content_type, payload = self._files[kind, path]
            return 200, {"Content-Type": content_type}, payload
        return 404, {}, b"not found\n"

    def _git_backend(self, method: str, path: str, query: str, headers: Message, body: bytes) -> Answer:
        env = {"PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": str(self._dir), "GIT_HTTP_EXPORT_ALL": "1",
               "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": method, "REMOTE_ADDR": "127.0.0.1",
               "CONTENT_TYPE": headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "HTTP_GIT_PROTOCOL": headers.get("Git-Protocol", ""),
               "HTTP_CONTENT_ENCODING": headers.get("Content-Encoding", "")}
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")  # CGI headers end in CRLF CRLF
        status, answer_headers = 200, {}
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            else:
                answer_headers[name] = value.strip()
        return status, answer_headers, payload


def _read_body(request: BaseHTTPRequestHandler) -> bytes:
    """The request's body, whether sent with Content-Length or chunked."""
    if "chunked" not in request.headers.get("Transfer-Encoding", "").lower():
        return request.rfile.read(int(request.headers.get("Content-Length") or 0))
    body = bytearray()
    while size := int(request.rfile.readline().split(b";")[0], 16):
        body += request.rfile.read(size)
        request.rfile.readline()
    while request.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
        pass
    return bytes(body)
