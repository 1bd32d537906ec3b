// An HTTPS upstream on 127.0.0.1 for the proxy tests, speaking HTTP/2 and HTTP/1.1 (ALPN).
// Usage: node tls_upstream.js CERT KEY LOG [AUTHORIZATION]
// Prints its port as the first line of stdout. Each request, once its body is read, is appended
// to LOG as one JSON line {method, path, httpVersion, headers, body_bytes} before it is answered.
// Routes:
//   /echo/...        200, that JSON
//   /bytes?n=N       N bytes, byte i being i % 251, streamed (chunked on HTTP/1.1)
//   /upload          POST or PUT: 200, {body_bytes, sha256} of the body
//   /redirect?to=U   302 to U
//   /private/...     200 with the echo JSON if `authorization` equals AUTHORIZATION, else 401
//   anything else    404
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const http2 = require('http2');

const [cert, key, log, required] = process.argv.slice(2);
const pattern = Buffer.alloc(65536 + 251, 0).map((_, i) => i % 251);

function stream(res, n) {
  res.writeHead(200, {'content-type': 'application/octet-stream'});
  let sent = 0;
  const more = () => {
    while (sent < n) {
      const size = Math.min(65536, n - sent);
      const chunk = pattern.subarray(sent % 251, sent % 251 + size);
      sent += size;
      if (!res.write(chunk)) return res.once('drain', more);
    }
    res.end();
  };
  more();
}

function answer(req, res) {
  const chunks = [];
  req.on('error', () => {});
  res.on('error', () => {});
  req.on('data', chunk => chunks.push(chunk));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    const seen = {method: req.method, path: req.url, httpVersion: req.httpVersion, headers: req.headers, body_bytes: body.length};
    fs.appendFileSync(log, JSON.stringify(seen) + '\n');
    const url = new URL(req.url, 'https://upstream.invalid');
    const json = (status, value) => {
      res.writeHead(status, {'content-type': 'application/json'});
      res.end(JSON.stringify(value));
    };
    if (url.pathname.startsWith('/echo/')) {
      json(200, seen);
    } else if (url.pathname === '/bytes') {
      stream(res, Number(url.searchParams.get('n')));
    } else if (url.pathname === '/upload' && (req.method === 'POST' || req.method === 'PUT')) {
      json(200, {body_bytes: body.length, sha256: crypto.createHash('sha256').update(body).digest('hex')});
    } else if (url.pathname === '/redirect') {
      res.writeHead(302, {location: url.searchParams.get('to')});
      res.end();
    } else if (url.pathname.startsWith('/private/')) {
      if (required !== undefined && req.headers.authorization === required) {
        json(200, seen);
      } else {
        res.writeHead(401, {'www-authenticate': 'Bearer'});
        res.end();
      }
    } else {
      json(404, {error: 'no such route'});
    }
  });
}

const server = http2.createSecureServer(
  {cert: fs.readFileSync(cert), key: fs.readFileSync(key), allowHTTP1: true, ALPNProtocols: ['h2', 'http/1.1']},
  answer);
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
