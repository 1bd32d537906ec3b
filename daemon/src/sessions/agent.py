# nix-sandbox-mcp session agent for Python: runs each request's code in one
# persistent namespace. Protocol (docs/sessions.md): requests on the first
# descriptor given ("<id> <bytes>\n" then the code), one JSON reply line per
# request on the second ({"id": N, "status": S}), nothing on stdout/stderr
# but the code's own output.
import json
import os
import sys
import traceback

requests_fd, replies_fd = int(sys.argv[1]), int(sys.argv[2])

# Not inherited by subprocesses, os.system or exec'd programs.
os.set_inheritable(requests_fd, False)
os.set_inheritable(replies_fd, False)
requests = os.fdopen(requests_fd, "rb")
replies = os.fdopen(replies_fd, "w", buffering=1)
sys.argv = [""]
namespace = {"__name__": "__main__", "__builtins__": __builtins__}


def reply(message):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    replies.write(json.dumps(message) + "\n")


reply({"ready": True})
while True:
    header = requests.readline()
    if not header:
        break
    call_id, size = header.split()
    code = requests.read(int(size)).decode("utf-8", "replace")
    status = 0
    try:
        exec(compile(code, "<session>", "exec"), namespace)
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException as e:
        # The traceback starts at the code, not at this loop.
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        status = 1
    reply({"id": int(call_id), "status": status})
