"""A minimal MCP client over stdio (Python standard library only), used by the
NixOS VM test, where the official SDK is not at hand.

    mcp_client.py list                      print the result of tools/list
    mcp_client.py run ENV CODE              print the result of tools/call run
    mcp_client.py session ENV CODE...       run each CODE in one session and
                                            print the list of results


Each invocation starts the server (`nix-sandbox-mcp --stdio`, or the command
in $MCP_SERVER), initializes a session, makes one request, and prints its
result as JSON on stdout.
"""

import json
import os
import shlex
import subprocess
import sys

PROTOCOL_VERSION = "2025-11-25"


class Session:
    def __init__(self, argv):
        self.server = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.last_id = 0

    def send(self, message):
        self.server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        self.server.stdin.flush()

    def request(self, method, params):
        self.last_id += 1
        self.send({"id": self.last_id, "method": method, "params": params})
        # The server may send notifications (logs, progress) before answering.
        for line in self.server.stdout:
            message = json.loads(line)
            if message.get("id") != self.last_id or "method" in message:
                continue
            if "error" in message:
                raise RuntimeError(f"{method}: {message['error']}")
            return message["result"]
        raise RuntimeError(f"{method}: the server closed its output")

    def initialize(self):
        result = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "nix-sandbox-mcp-vm-test", "version": "1"},
            },
        )
        if result["protocolVersion"] != PROTOCOL_VERSION:
            raise RuntimeError(f"server negotiated {result['protocolVersion']}")
        self.send({"method": "notifications/initialized"})

    def close(self):
        self.server.stdin.close()
        self.server.wait(timeout=30)


def main(args):
    argv = shlex.split(os.environ.get("MCP_SERVER", "nix-sandbox-mcp --stdio"))
    session = Session(argv)
    try:
        session.initialize()
        if args[:1] == ["list"]:
            result = session.request("tools/list", {})
        elif args[:1] == ["run"] and len(args) == 3:
            result = session.request(
                "tools/call",
                {"name": "run", "arguments": {"env": args[1], "code": args[2]}},
            )
        elif args[:1] == ["session"] and len(args) >= 3:
            result = [
                session.request(
                    "tools/call",
                    {"name": "run", "arguments": {"env": args[1], "code": code, "session": "vm"}},
                )
                for code in args[2:]
            ]
        else:
            sys.exit(__doc__)
    finally:
        session.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
