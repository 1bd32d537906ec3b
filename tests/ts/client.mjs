// The server driven by the official TypeScript SDK's client over stdio:
// the handshake (this SDK speaks 2025-11-25), the tool list, a run, a
// session, and an error a model can act on. Exits non-zero on the first
// difference. Usage: NSM_BIN=path/to/nix-sandbox-mcp node client.mjs
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const bin = process.env.NSM_BIN;
assert.ok(bin, "set NSM_BIN to the server binary");

const transport = new StdioClientTransport({
  command: bin,
  args: ["--stdio"],
  env: { ...process.env, RUST_LOG: "warn" },
  stderr: "ignore",
});
const client = new Client({ name: "ts-sdk-test", version: "1" });
await client.connect(transport);
try {
  assert.equal(client.getServerVersion()?.name, "nix-sandbox-mcp");

  const { tools } = await client.listTools();
  assert.deepEqual(tools.slice(0, 2).map((t) => t.name), ["run", "job"]);

  const run = await client.callTool({ name: "run", arguments: { env: "bash", code: "echo $((6 * 7))" } });
  assert.equal(run.isError, false, JSON.stringify(run));
  assert.equal(run.structuredContent.stdout, "42\n");
  assert.ok(run.structuredContent.ran.server.startsWith("nix-sandbox-mcp "), JSON.stringify(run));

  await client.callTool({ name: "run", arguments: { env: "python", code: "x = 41", session: "ts" } });
  const again = await client.callTool({ name: "run", arguments: { env: "python", code: "print(x + 1)", session: "ts" } });
  assert.equal(again.structuredContent.stdout, "42\n", JSON.stringify(again));
  assert.equal(again.structuredContent.session.state, "continued");

  const bad = await client.callTool({ name: "run", arguments: { env: "no-such-env", code: "1" } });
  assert.equal(bad.isError, true);
  assert.equal(bad.structuredContent.error.code, "unknown_env", JSON.stringify(bad));
  console.log("ok: the TypeScript SDK client (2025-11-25): handshake, tools, a run, a session, an error");
} finally {
  await client.close();
}
