"""OAuth 2.1 over `serve --http`, against a test issuer on loopback (a key
pair, its JWKS): the protected resource metadata, the challenge on 401,
and every kind of bad access token refused with the right status and
nothing run; scopes become what a caller may do; an issuer that cannot
be reached fails closed."""

from __future__ import annotations

import json
import time

import pytest

from harness import BIN, run_async, start, write_config
from http_transport import HttpServer, b64url, client, issuer
from test_http import env, raw, refused, run_ok, scratch


@pytest.fixture
def srv():
    audit = scratch() / "audit.jsonl"
    s = HttpServer(BIN, scratch(), env=env(), principals=(), oauth=True,
                   config=write_config(f'[server]\naudit_log = "{audit}"\n'))
    s.audit = audit
    yield s
    assert s.stop() == 0, s.log_tail()


def tools_call(code: str = "echo ran") -> dict:
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run", "arguments": {"env": "bash", "code": code}}}


def nothing_ran(s: HttpServer) -> None:
    assert not s.audit.exists() or s.audit.read_text() == "", s.audit.read_text()


def test_the_metadata_names_the_issuer_and_a_401_points_to_it(srv):
    code, _, meta = raw(srv, method="GET", path="/.well-known/oauth-protected-resource/mcp", token=None, body=None)
    assert code == 200 and meta["resource"] == srv.resource and meta["authorization_servers"] == [issuer().url], meta
    assert "sandbox:run" in meta["scopes_supported"]
    assert raw(srv, method="GET", path="/.well-known/oauth-protected-resource", token=None, body=None)[2] == meta
    h = refused(401, raw(srv, token=None))
    want = f'resource_metadata="http://127.0.0.1:{srv.port}/.well-known/oauth-protected-resource/mcp"'
    assert want in h["www-authenticate"], h


def test_every_bad_access_token_is_refused_and_nothing_runs(srv):
    from cryptography.hazmat.primitives.asymmetric import rsa
    iss = issuer()
    aud = srv.resource
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    header_none = b64url(json.dumps({"alg": "none", "typ": "JWT", "kid": iss.kid}).encode())
    claims = b64url(json.dumps({"iss": iss.url, "aud": aud, "sub": "eve", "exp": now + 600, "scope": "sandbox:run"}).encode())
    cases = {
        "malformed": "not-a-jwt.at-all.x",
        "wrong signature": iss.token(aud, sub="eve", key=other_key),
        "wrong audience": iss.token("http://127.0.0.1:1/other", sub="eve"),
        "wrong issuer": iss.token(aud, sub="eve", iss="http://127.0.0.1:1"),
        "expired": iss.token(aud, sub="eve", exp=now - 3600, iat=now - 7200),
        "not yet valid": iss.token(aud, sub="eve", nbf=now + 3600),
        "alg none": f"{header_none}.{claims}.",
        "unknown key id": iss.token(aud, sub="eve", kid="not-in-the-jwks"),
        "shared secret": iss.token(aud, sub="eve", key="a-guessed-secret-of-thirty-two-bytes!", alg="HS256"),
        "no subject": iss.token(aud, sub=None),
        "no expiry": iss.token(aud, sub="eve", exp=None),
    }
    for why, token in cases.items():
        h = refused(401, raw(srv, body=tools_call(), token=token))
        assert 'error="invalid_token"' in h["www-authenticate"] and "resource_metadata=" in h["www-authenticate"], (why, h)
    # A valid token lacking the scope: 403, naming the scope.
    h = refused(403, raw(srv, body=tools_call(), token=iss.token(aud, sub="eve", scope="sandbox:commands")), "sandbox:run")
    assert 'error="insufficient_scope"' in h["www-authenticate"] and 'scope="sandbox:run"' in h["www-authenticate"], h
    nothing_ran(srv)
    assert "eve" not in srv.log_tail(10**6) or "Bearer" not in srv.log_tail(10**6)


def test_a_valid_token_runs_as_its_subject_within_its_scopes(srv):
    iss = issuer()

    async def t():
        token = iss.token(srv.resource, sub="alice", scope="sandbox:run sandbox:env:bash")
        async with client(srv.url, token) as c:
            await start(c, over_http=True)
            assert (await run_ok(c, "echo as alice"))["stdout"] == "as alice\n"
            res = await c.call_tool("run", {"env": "python", "code": "print(1)"})
            assert res.is_error and res.structured_content["error"]["code"] == "forbidden", res
            assert [t.name for t in (await c.list_tools()).tools] == ["run", "job"]
    run_async(t)
    entries = [json.loads(line) for line in srv.audit.read_text().splitlines()]
    assert [e["principal"] for e in entries] == ["oauth:alice"], entries


def test_an_issuer_that_cannot_be_reached_fails_closed():
    iss = issuer()
    iss.up = False
    try:
        s = HttpServer(BIN, scratch(), env=env(), principals=(), oauth=True)
        try:
            refused(503, raw(s, token=iss.token(s.resource)), "cannot be fetched")
        finally:
            s.stop()
    finally:
        iss.up = True
    s = HttpServer(BIN, scratch(), env=env(), principals=(), oauth=True)
    try:
        assert raw(s, token=iss.token(s.resource))[0] == 200
    finally:
        s.stop()


def test_oauth_needs_the_resource_and_an_https_issuer():
    for table, words in [('[http.oauth]\nissuer = "http://127.0.0.1:1"\n', "needs `resource`"),
                         ('[http]\nresource = "https://a.example/mcp"\n[http.oauth]\nissuer = "http://auth.example"\n', "use https")]:
        import subprocess
        out = subprocess.run([BIN, "--config", write_config(table), "serve", "--http", "127.0.0.1:0"], env=env(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and words in out.stderr, out.stderr
