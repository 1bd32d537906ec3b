"""One `run` call over Streamable HTTP (MCP 2025-11-25), with the standard
library only (the VM has no MCP SDK): initialize, initialized, tools/call.
Prints the call's structured result as JSON; exits 1 when it is an error.
Usage: http-call.py HOST:PORT ENV CODE"""

import json
import sys
import urllib.request


def post(url: str, body: dict, session: str | None) -> tuple[dict | None, str | None]:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-11-25"}
    if session:
        headers["mcp-session-id"] = session
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=120) as r:
        text = r.read().decode()
        session = r.headers.get("mcp-session-id", session)
    # A JSON body, or server-sent events whose data lines carry the reply.
    for chunk in [text] + [line[5:] for line in text.splitlines() if line.startswith("data:")]:
        try:
            reply = json.loads(chunk)
        except ValueError:
            continue
        if isinstance(reply, dict) and reply.get("id") == body.get("id"):
            return reply, session
    return None, session


def main() -> int:
    address, env, code = sys.argv[1:4]
    url = f"http://{address}/mcp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "vm-tier", "version": "1"}}}
    _, session = post(url, init, None)
    post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    reply, _ = post(url, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                          "params": {"name": "run", "arguments": {"env": env, "code": code}}}, session)
    result = (reply or {}).get("result", {})
    print(json.dumps(result.get("structuredContent", reply)))
    return 1 if result.get("isError") or not result else 0


sys.exit(main())
