// nix-sandbox-mcp session agent for Node.js: runs each request's code in one
// persistent global scope. Protocol (docs/sessions.md): requests on the first
// descriptor given ("<id> <bytes>\n" then the code), one JSON reply line per
// request on the second ({"id": N, "status": S}), nothing on stdout/stderr
// but the code's own output.
'use strict';
const fs = require('fs');
const vm = require('vm');

// Node has no fcntl: both pipes are reopened through /proc, which makes them
// close-on-exec, so that child processes inherit neither.
const reopen = (fd, mode) => {
  const own = fs.openSync(`/proc/self/fd/${fd}`, mode);
  fs.closeSync(fd);
  return own;
};
const [requestsFd, replies] = process.argv.slice(2, 4).map(Number)
  .map((fd, i) => reopen(fd, i === 0 ? 'r' : 'w'));

process.argv.splice(1);
globalThis.require = require;
globalThis.__dirname = process.cwd();

// process.exit ends the call, not the session.
class Exit {
  constructor(code) { this.code = code; }
}
const exitProcess = process.exit.bind(process);
process.exit = (code) => { throw new Exit(code ?? process.exitCode ?? 0); };

// A stack trace ends at the code, not in this agent.
const ownFramesRemoved = (stack) => String(stack).split('\n')
  .filter((line) => !(/^\s+at /.test(line) && (line.includes(__filename) || line.includes('node:vm') || line.includes('node:internal'))))
  .join('\n');

let status = 0;
const fail = (e) => {
  if (e instanceof Exit) { status = Number(e.code) & 0xff; return; }
  process.stderr.write((e && e.stack) ? `${ownFramesRemoved(e.stack)}\n` : `Uncaught ${String(e)}\n`);
  status = 1;
};
process.on('uncaughtException', fail);
process.on('unhandledRejection', fail);

// Output still queued in a stream reaches the daemon before the reply
// does; an empty queue needs no turn of the event loop.
const flush = (stream) => stream.writableLength === 0
  ? null : new Promise((resolve) => stream.write('', resolve));
const reply = async (message) => {
  await flush(process.stdout);
  await flush(process.stderr);
  fs.writeSync(replies, `${JSON.stringify(message)}\n`);
};

// Resources the agent itself holds; a call is over when only these are left,
// as a script is over when its event loop empties.
const count = (list) => list.reduce((m, r) => m.set(r, (m.get(r) || 0) + 1), new Map());
const settled = (baseline) => {
  for (const [kind, n] of count(process.getActiveResourcesInfo())) {
    if (kind !== 'TTYWrap' && n > (baseline.get(kind) || 0)) return false;
  }
  return true;
};
const idle = async (baseline) => {
  while (!settled(baseline)) await new Promise((r) => setImmediate(r));
};

async function run(id, code) {
  const baseline = count(process.getActiveResourcesInfo());
  status = 0;
  try {
    const result = vm.runInThisContext(code, { filename: 'session.js' });
    if (result && typeof result.then === 'function') await result;
  } catch (e) {
    fail(e);
  }
  await idle(baseline);
  await reply({ id, status });
}

// Requests are read blocking, between calls: the event loop runs only
// while a call does, so nothing the code left behind runs between calls
// (the daemon also stops the sandbox then), and a request is taken as soon
// as it is written, without a turn of the loop.
const chunk = Buffer.alloc(64 << 10);
let pending = Buffer.alloc(0);
const more = () => {
  const n = fs.readSync(requestsFd, chunk, 0, chunk.length, null);
  if (n > 0) pending = Buffer.concat([pending, chunk.subarray(0, n)]);
  return n > 0;
};
// The next request, or null when the daemon closed the session.
const nextRequest = () => {
  let end;
  while ((end = pending.indexOf(10)) < 0) if (!more()) return null;
  const [id, size] = pending.subarray(0, end).toString().split(' ').map(Number);
  while (pending.length < end + 1 + size) if (!more()) return null;
  const code = pending.subarray(end + 1, end + 1 + size).toString();
  pending = pending.subarray(end + 1 + size);
  return { id, code };
};
const serve = async () => {
  for (let request = nextRequest(); request; request = nextRequest()) {
    await run(request.id, request.code);
  }
  // The daemon closed the session: end even if the code left timers behind.
  exitProcess(0);
};
reply({ ready: true }).then(serve);
