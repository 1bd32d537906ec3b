"""Starts each stand-in of stand_ins.py and uses it directly, without the
proxy: curl, git, npm, pip and cargo pointed at the test CA and sending the
required Authorization header themselves (pip as basic auth from its index
URL; cargo, which sends none to a registry that does not ask, against a
stand-in that requires none). Prints one line per check and exits with
status 1 if any failed. Run: .venv/bin/python tests/mcp/stand_ins_check.py"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from stand_ins import ApiUpstream, PackageStandIns, TestCA

PYTHON = "/usr/bin/python3"
CARGO = shutil.which("cargo") or "/root/.cargo/bin/cargo"
MARKS = PackageStandIns.MARKS
# Without the CA bundles, pip find-links and the like this environment may set, which would win over the flags below.
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if not k.startswith(("PIP_", "GIT_", "CARGO_", "NPM_CONFIG_", "npm_config_"))
             and k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")}
failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += not ok
    print(("ok   " if ok else "FAIL ") + name + ("" if ok or not detail else ": " + detail.strip()[-1500:]), flush=True)


def run(*argv: str | pathlib.Path, env: dict[str, str] | None = None,
        cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**CLEAN_ENV, **(env or {})})


def tools() -> None:
    for argv in (["curl", "--version"], ["git", "--version"], ["node", "--version"], ["npm", "--version"],
                 [PYTHON, "-m", "pip", "--version"], [CARGO, "--version"]):
        try:
            r = run(*argv)
            check(f"tool {' '.join(argv[:-1])}: {r.stdout.partition(chr(10))[0]}", r.returncode == 0, r.stderr)
        except OSError as e:
            check(f"tool {argv[0]}", False, str(e))


def check_api(ca: TestCA, scratch: pathlib.Path) -> None:
    secret = "Bearer upstream-secret"
    with ApiUpstream(*ca.issue(["api.creds.test"]), authorization=secret) as up:
        curl = ["curl", "-sS", "--cacert", ca.ca_pem, "--resolve", f"api.creds.test:{up.port}:127.0.0.1"]
        upload = scratch / "upload"
        upload.write_bytes(os.urandom(300_000))
        for version, flag in (("1.1", "--http1.1"), ("2.0", "--http2")):
            for base in (up.url(), up.url("api.creds.test")):
                r = run(*curl, flag, "-H", "X-Probe: 1", f"{base}/echo/hello")
                seen = json.loads(r.stdout) if r.returncode == 0 else {}
                check(f"api HTTP/{version} {base}/echo/hello",
                      seen.get("httpVersion") == version and seen["headers"].get("x-probe") == "1", r.stderr + r.stdout)
            n, body = 1_000_003, scratch / "bytes"
            r = run(*curl, flag, "-D", "-", "-o", body, f"{up.url()}/bytes?n={n}")
            head = r.stdout.lower()
            framed = "content-length" not in head and ("transfer-encoding: chunked" in head or version == "2.0")
            check(f"api HTTP/{version} /bytes?n={n} streamed", framed and body.read_bytes() == ApiUpstream.pattern(n),
                  r.stderr + r.stdout)
            chunked = ["-H", "Transfer-Encoding: chunked"] if version == "1.1" else ["-X", "PUT"]
            r = run(*curl, flag, *chunked, "--data-binary", f"@{upload}", f"{up.url()}/upload")
            answer = json.loads(r.stdout) if r.returncode == 0 else {}
            check(f"api HTTP/{version} /upload {' '.join(chunked)}", answer.get("body_bytes") == 300_000,
                  r.stderr + r.stdout)
            r = run(*curl, flag, "-o", "/dev/null", "-w", "%{http_code} %{redirect_url}",
                    f"{up.url()}/redirect?to=https://elsewhere.test/x")
            check(f"api HTTP/{version} /redirect", r.stdout == "302 https://elsewhere.test/x", r.stderr + r.stdout)
            codes = [run(*curl, flag, *auth, "-o", "/dev/null", "-w", "%{http_code}", f"{up.url()}/private/x").stdout
                     for auth in ([], ["-H", f"Authorization: {secret}"])]
            check(f"api HTTP/{version} /private: 401 without the header, 200 with it", codes == ["401", "200"], str(codes))
        seen = up.requests()
        uploads = [s for s in seen if s["path"] == "/upload"]
        check("api log: every request, refused ones too",
              len(seen) == 14 and [s["headers"].get("authorization") for s in seen if s["path"] == "/private/x"] == [None, secret, None, secret]
              and uploads[0]["headers"].get("transfer-encoding") == "chunked" and uploads[0]["body_bytes"] == 300_000
              and [s["httpVersion"] for s in uploads] == ["1.1", "2.0"], json.dumps(seen)[:1500])
    for what, (cert, key) in (("an untrusted CA", ca.issue_untrusted(["api.creds.test"])), ("the wrong name", ca.issue_wrong_name())):
        with ApiUpstream(cert, key) as bad:
            r = run("curl", "-sS", "--cacert", ca.ca_pem, "--resolve", f"api.creds.test:{bad.port}:127.0.0.1",
                    f"{bad.url('api.creds.test')}/echo/x")
            check(f"api certificate of {what} does not verify (curl exit 60)", r.returncode == 60, r.stderr)


def check_packages(ca: TestCA, scratch: pathlib.Path) -> None:
    token = "package-secret"
    with PackageStandIns(ca, f"Bearer {token}") as pkgs:
        curl = ["curl", "-sS", "--cacert", ca.ca_pem] + [a for k in pkgs.KINDS for a in ("--resolve", f"{k}.creds.test:{pkgs.port}:127.0.0.1")]
        probes = {"pypi": "simple/nsm-demo/", "npm": "nsm-demo", "git": "demo.git/info/refs?service=git-upload-pack",
                  "cargo": "index/config.json"}
        for kind, probe in probes.items():
            r = run(*curl, "-D", "-", "-o", "/dev/null", pkgs.url(kind, direct=True) + probe)
            check(f"{kind}: refused without the header", r.stdout.startswith("HTTP/1.1 401")
                  and "www-authenticate: bearer" in r.stdout.lower(), r.stderr + r.stdout)
            for direct in (False, True):
                url = pkgs.url(kind, direct)
                r = run(*curl, "-H", f"Authorization: Bearer {token}", "--fail", url + probe)
                body = r.stdout
                ok = {"pypi": lambda: PackageStandIns.WHEEL in body,
                      "npm": lambda: json.loads(body)["versions"]["1.0.0"]["dist"]["tarball"].startswith(url),
                      "git": lambda: "# service=git-upload-pack" in body,
                      "cargo": lambda: json.loads(body)["dl"].startswith(url)}[kind]
                check(f"{kind}: {url}{probe}", r.returncode == 0 and ok(), r.stderr + body[:500])

        clone = scratch / "clone"
        git_env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
        r = run("git", "-c", f"http.sslCAInfo={ca.ca_pem}", "-c", f"http.extraHeader=Authorization: Bearer {token}",
                "clone", "-q", pkgs.url("git", direct=True) + "demo.git", clone, env=git_env)
        check("git clone", r.returncode == 0 and (clone / "README").read_text().strip() == MARKS["git"], r.stderr)

        registry, project, npmrc = pkgs.url("npm", direct=True), scratch / "npm-project", scratch / "npmrc"
        project.mkdir()
        npmrc.write_text(f"cafile={ca.ca_pem}\n{registry.removeprefix('https:')}:_authToken={token}\nupdate-notifier=false\n")
        r = run("npm", "install", "nsm-demo", "--registry", registry, "--userconfig", npmrc, "--globalconfig", os.devnull,
                "--cache", scratch / "npm-cache", "--no-audit", "--no-fund", "--offline=false", cwd=project)
        value = run("node", "-p", "require('nsm-demo')", cwd=project).stdout.strip() if r.returncode == 0 else ""
        check("npm install", value == MARKS["npm"], r.stderr + r.stdout)

        seen = pkgs.requests()
        check("packages log: all requests, the refused ones without the header",
              sum(s["status"] == 401 for s in seen) == 4
              and all(s["authorization"] == (s["status"] != 401) for s in seen), json.dumps(seen)[:1500])

    user, password = "pip-user", "pip-password"
    with PackageStandIns(ca, "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()) as pkgs:
        index, target = pkgs.url("pypi", direct=True).replace("https://", f"https://{user}:{password}@") + "simple/", scratch / "pip"
        r = run(PYTHON, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-input",
                "--cert", ca.ca_pem, "--index-url", index, "--target", target, "nsm-demo",
                env={"PIP_CONFIG_FILE": os.devnull})
        value = run(PYTHON, "-c", "import nsm_demo; print(nsm_demo.VALUE)", env={"PYTHONPATH": str(target)})
        check("pip install", r.returncode == 0 and value.stdout.strip() == MARKS["pypi"], r.stderr + r.stdout + value.stderr)

    with PackageStandIns(ca, None) as pkgs:
        project = scratch / "cargo-project"
        (project / "src").mkdir(parents=True)
        (project / ".cargo").mkdir()
        (project / "Cargo.toml").write_text('[package]\nname = "check"\nversion = "0.1.0"\nedition = "2021"\n\n'
                                            '[dependencies]\nnsm-demo = { version = "1", registry = "private" }\n')
        (project / "src" / "main.rs").write_text('fn main() { println!("{}", nsm_demo::VALUE); }\n')
        (project / ".cargo" / "config.toml").write_text(
            f'[registries.private]\nindex = "sparse+{pkgs.url("cargo", direct=True)}index/"\n')
        env = {"CARGO_HOME": str(scratch / "cargo-home"), "CARGO_HTTP_CAINFO": str(ca.ca_pem),
               "CARGO_TARGET_DIR": str(scratch / "cargo-target")}
        r = run(CARGO, "fetch", cwd=project, env=env)
        check("cargo fetch", r.returncode == 0, r.stderr)
        r = run(CARGO, "run", "-q", "--offline", cwd=project, env=env)
        check("cargo run --offline (the fetched crate builds)", r.stdout.strip() == MARKS["cargo"], r.stderr + r.stdout)


def main() -> int:
    tools()
    with TestCA() as ca, tempfile.TemporaryDirectory(prefix="nsm-stand-ins-") as scratch:
        check_api(ca, pathlib.Path(scratch))
        check_packages(ca, pathlib.Path(scratch))
    print(f"{failures} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
