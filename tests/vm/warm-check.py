"""Inside the VM: a server started by LAUNCHER... answers a python call from
a pre-started interpreter (running for over a second when the code starts)
with exactly what a cold start shows. Usage: warm-check.py LAUNCHER... BIN CONFIG"""

import json
import subprocess
import sys
import time

*launch, binary, config = sys.argv[1:]
CODE = """import os, sys
start = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])
age = float(open('/proc/uptime').read().split()[0]) - start / os.sysconf('SC_CLK_TCK')
print(sys.argv, __file__, os.getcwd(), sorted(os.environ), os.listdir('/tmp'), sorted(os.listdir('/proc/self/fd')))
print(age, file=sys.stderr)
"""
EXPECTED = ("['/workspace/.main.py'] /workspace/.main.py /workspace "
            "['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE', 'PYTHONUNBUFFERED', 'TERM', 'TMPDIR'] [] "
            "['0', '1', '2', '3']\n")

server = subprocess.Popen([*launch, binary, "--config", config, "--stdio"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def request(n: int, method: str, params: dict) -> dict:
    server.stdin.write((json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}) + "\n").encode())
    server.stdin.flush()
    while True:
        reply = json.loads(server.stdout.readline())
        if reply.get("id") == n:
            return reply


request(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                          "clientInfo": {"name": "vm", "version": "1"}})
server.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
request(1, "tools/list", {})
time.sleep(3)
result = request(2, "tools/call", {"name": "run", "arguments": {"env": "python", "code": CODE}})["result"]
server.stdin.close()
server.wait(timeout=20)
out = result["structuredContent"]
age = float(out["stderr"] or 0)
print(f"stdout {out['stdout']!r}, interpreter running {age:.2f} s when the code started")
sys.exit(0 if out["stdout"] == EXPECTED and age >= 1.0 else 1)
