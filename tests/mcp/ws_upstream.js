// A WebSocket host on 127.0.0.1 over TLS (HTTP/1.1) for the proxy tests.
// Usage: node ws_upstream.js CERT KEY LOG
// Prints its port as the first line of stdout. Each handshake's headers are
// appended to LOG as one JSON line {path, headers}. After switching, it sends
// a text message with the handshake's Authorization header ({"authorization":
// ...}), then the header's value again as one message cut into three
// fragments with a ping between the last two, then echoes every text message
// it gets, and answers a close with a close. Its 101 always names
// permessage-deflate, asked for or not (it never compresses): a host the
// proxy must not let choose compression.
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const https = require('https');

const [cert, key, log] = process.argv.slice(2);

function frame(first, payload) {
  const n = payload.length;
  const head = n < 126 ? Buffer.from([first, n])
    : Buffer.concat([Buffer.from([first, 126]), Buffer.from([n >> 8, n & 255])]);
  return Buffer.concat([head, payload]);
}

function serve(socket, authorization) {
  socket.write(frame(0x81, Buffer.from(JSON.stringify({authorization}))));
  const value = Buffer.from(authorization || '');
  const third = Math.max(1, Math.floor(value.length / 3));
  socket.write(frame(0x01, value.subarray(0, third)));
  socket.write(frame(0x00, value.subarray(third, 2 * third)));
  socket.write(frame(0x89, Buffer.alloc(0)));
  socket.write(frame(0x80, value.subarray(2 * third)));
  let pending = Buffer.alloc(0);
  socket.on('data', chunk => {
    pending = Buffer.concat([pending, chunk]);
    for (;;) {
      if (pending.length < 2) return;
      let length = pending[1] & 0x7f, at = 2;
      if (length === 126) { if (pending.length < 4) return; length = pending.readUInt16BE(2); at = 4; }
      if (pending.length < at + 4 + length) return;
      const mask = pending.subarray(at, at + 4);
      const payload = Buffer.from(pending.subarray(at + 4, at + 4 + length)).map((b, i) => b ^ mask[i % 4]);
      const opcode = pending[0] & 0x0f;
      pending = pending.subarray(at + 4 + length);
      if (opcode === 0x8) { socket.end(frame(0x88, Buffer.alloc(0))); return; }
      if (opcode === 0x1) socket.write(frame(0x81, payload));
    }
  });
  socket.on('error', () => {});
}

const server = https.createServer({cert: fs.readFileSync(cert), key: fs.readFileSync(key)}, (req, res) => {
  res.writeHead(404);
  res.end();
});
server.on('upgrade', (req, socket) => {
  fs.appendFileSync(log, JSON.stringify({path: req.url, headers: req.headers}) + '\n');
  const accept = crypto.createHash('sha1')
    .update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
               `Sec-WebSocket-Accept: ${accept}\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n`);
  serve(socket, req.headers.authorization);
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
