# NixOS VM test (a flake check): the NixOS module's server with the real
# presets, driven over stdio by an MCP client as an unprivileged user.
{
  pkgs,
  nixosModule,
}:
pkgs.testers.runNixOSTest {
  name = "nix-sandbox-mcp";

  nodes.machine =
    { pkgs, ... }:
    {
      imports = [ nixosModule ];

      programs.nix-sandbox-mcp = {
        enable = true;
        settings.project.path = "/srv/project";
        environments = {
          bash.preset = "bash";
          python.preset = "python";
          node.preset = "node";
          slow = {
            preset = "bash";
            timeout_ms = 2000;
          };
        };
      };

      # The same server for a team: two socket-activated replicas.
      services.nix-sandbox-mcp.http = {
        enable = true;
        listen = "127.0.0.1:8765";
        replicas = 2;
        socketActivation = true;
      };

      users.users.alice.isNormalUser = true;
      # Owned by alice, so that her code could write it if the overlay let it through.
      systemd.tmpfiles.rules = [
        "d /srv/project 0755 alice users -"
        "f /srv/project/README 0644 alice users - hello from the project"
      ];

      environment.systemPackages = [
        (pkgs.writeShellScriptBin "mcp-client" ''
          exec ${pkgs.python3.interpreter} ${./mcp_client.py} "$@"
        '')
      ];
      virtualisation.memorySize = 2048;
    };

  testScript = ''
    import json
    import shlex

    machine.wait_for_unit("multi-user.target")


    def mcp(*args):
        command = "cd /tmp && runuser -u alice -- env HOME=/home/alice mcp-client " + shlex.join(args)
        return json.loads(machine.succeed(command))


    def run(env, code):
        return mcp("run", env, code)["structuredContent"]


    with subtest("the run tool offers the configured environments"):
        tools = mcp("list")["tools"]
        assert [t["name"] for t in tools] == ["run", "job"], tools
        envs = sorted(tools[0]["inputSchema"]["properties"]["env"]["enum"])
        assert envs == ["bash", "node", "python", "slow"], envs

    with subtest("python, bash and node run"):
        r = run("python", "import sys, requests\nprint(6 * 7, sys.version_info[0])")
        assert r["ok"] and r["stdout"] == "42 3\n", r
        r = run("bash", "echo $((6 * 7)); jq -n '[1, 2] | add'; rg --version | head -n 1")
        assert r["ok"] and r["stdout"].startswith("42\n3\nripgrep "), r
        r = run("node", "console.log([1, 2, 3].map((x) => x * 2).join(','))")
        assert r["ok"] and r["stdout"] == "2,4,6\n", r

    with subtest("only the closure is visible"):
        r = run("python", "import os\nprint(os.listdir('/usr'), os.listdir('/usr/bin'), os.path.exists('/run/current-system'), os.path.exists('/home/alice'))")
        assert r["ok"] and r["stdout"] == "['bin'] ['env'] False False\n", r

    with subtest("the project is a copy-on-write overlay: writable, the host's files untouched"):
        r = run("bash", "cat /project/README; echo; echo made > /project/new && cat /project/new")
        assert r["ok"] and r["stdout"] == "hello from the project\nmade\n", r
        assert r["changes"]["added"] == 1 and "+made" in r["changes"]["patch"], r
        machine.fail("test -e /srv/project/new")

    with subtest("the network is blocked"):
        machine.succeed("systemd-run --unit=listener ${pkgs.python3.interpreter} -m http.server 8000 --bind 0.0.0.0")
        machine.wait_for_open_port(8000)
        address = machine.succeed("ip -4 -o addr show scope global").split()[3].split("/")[0]
        probe = "import socket, sys\nfor host in sys.argv[1:] or ['127.0.0.1', '%s']:\n    try:\n        socket.create_connection((host, 8000), timeout=3).close()\n        print(host, 'reachable')\n    except OSError:\n        print(host, 'unreachable')\n" % address
        # The listener answers outside the sandbox...
        machine.succeed("${pkgs.python3.interpreter} -c " + shlex.quote(probe) + " " + address + " | grep -q ' reachable'")
        # ...but not from inside, neither on its address nor on loopback.
        r = run("python", probe)
        assert r["ok"] and r["stdout"] == "127.0.0.1 unreachable\n%s unreachable\n" % address, r

    with subtest("a session keeps state between calls"):
        results = [c["structuredContent"] for c in mcp("session", "python", "import json\nx = 41", "print(json.dumps(x + 1))")]
        assert results[1]["ok"] and results[1]["stdout"] == "42\n", results
        assert results[1]["session"] == {"name": "vm", "state": "continued"}, results
        results = [c["structuredContent"] for c in mcp("session", "node", "var n = 1", "console.log(n + 1)")]
        assert results[1]["stdout"] == "2\n", results
        results = [c["structuredContent"] for c in mcp("session", "bash", "cd /tmp && v=1", "echo $v $PWD")]
        assert results[1]["stdout"] == "1 /tmp\n", results

    with subtest("services.nix-sandbox-mcp.http: two hardened, socket-activated replicas with cgroup v2 limits"):
        for port, name in ((8765, "r1"), (8766, "r2")):
            reply = machine.succeed("${pkgs.python3.interpreter} ${../../tests/vm/http-call.py} 127.0.0.1:%d bash 'echo $((6 * 7))'" % port)
            r = json.loads(reply)
            assert r["ok"] and r["stdout"] == "42\n", r
            machine.succeed("journalctl -u nix-sandbox-mcp@%s.service | grep -q 'limits: cgroup v2'" % name)
            machine.succeed("test -d /var/cache/nix-sandbox-mcp/%s" % name)

    with subtest("a run past its time limit is killed"):
        result = mcp("run", "slow", "sleep 30")
        r = result["structuredContent"]
        assert result["isError"] and not r["ok"] and r["timed_out"], r
        assert r["error"]["code"] == "timeout", r
  '';
}
