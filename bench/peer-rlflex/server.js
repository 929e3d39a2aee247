// The peer for bench/run: rate-limiter-flexible's RateLimiterPostgres (over
// the `pg` pool) behind the same request shape as pglimit's ad hoc form:
//
//   POST /check {"key": "k42", "limit": 1000, "window": "1h", "cost": 1}
//   -> 200 when allowed, 429 when denied, a small JSON body either way.
//
// Environment: DATABASE_URL (required), PEER_BIND (host:port, default
// 127.0.0.1:8090), PEER_POOL_SIZE (pg connections, default 16, as pglimit's
// lanes), PEER_INMEMORY_BLOCK=1 to set inMemoryBlockOnConsumed = limit (a key
// that reached its limit is then denied from memory until its window ends).
'use strict';

const http = require('http');
const { Pool } = require('pg');
const { RateLimiterPostgres } = require('rate-limiter-flexible');

const MAX_BODY = 16 * 1024;
const TABLE = 'rlflex';
const UNITS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

const url = process.env.DATABASE_URL;
if (!url) {
  console.error('peer-rlflex: DATABASE_URL is required');
  process.exit(2);
}
const [host, port] = (process.env.PEER_BIND || '127.0.0.1:8090').split(':');
const inMemoryBlock = process.env.PEER_INMEMORY_BLOCK === '1';
const pool = new Pool({ connectionString: url, max: Number(process.env.PEER_POOL_SIZE || 16) });

// One limiter per (limit, window): rate-limiter-flexible fixes both per
// instance. They share one table; the key prefix keeps their keys apart.
const limiters = new Map();
function limiterFor(limit, seconds) {
  const id = `${limit}/${seconds}`;
  let limiter = limiters.get(id);
  if (!limiter) {
    const opts = {
      storeClient: pool,
      storeType: 'pool',
      tableName: TABLE,
      tableCreated: true,
      keyPrefix: `l${limit}w${seconds}`,
      points: limit,
      duration: seconds,
    };
    if (inMemoryBlock) opts.inMemoryBlockOnConsumed = limit;
    limiter = new RateLimiterPostgres(opts);
    limiters.set(id, limiter);
  }
  return limiter;
}

function parseWindow(text) {
  const m = /^([0-9]+)(ms|s|m|h|d)$/.exec(text);
  if (!m) return null;
  const ms = Number(m[1]) * UNITS[m[2]];
  return ms >= 100 ? Math.ceil(ms / 1000) : null;
}

function send(res, status, body) {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function decide(res, body) {
  let req;
  try {
    req = JSON.parse(body);
  } catch (e) {
    return send(res, 400, { error: 'malformed-json' });
  }
  const { key, limit, window, cost = 1 } = req || {};
  const seconds = typeof window === 'string' ? parseWindow(window) : null;
  if (typeof key !== 'string' || key.length === 0 || key.length > 256
      || !Number.isInteger(limit) || limit < 1 || limit > 1e9
      || seconds === null || !Number.isInteger(cost) || cost < 0 || cost > limit) {
    return send(res, 400, { error: 'invalid-field' });
  }
  limiterFor(limit, seconds).consume(key, cost).then(
    (r) => send(res, 200, {
      allowed: true, limit, remaining: r.remainingPoints,
      reset_at: new Date(Date.now() + r.msBeforeNext).toISOString(), retry_after_s: null,
    }),
    (r) => {
      if (r instanceof Error) return send(res, 500, { error: String(r.message || r) });
      return send(res, 429, {
        allowed: false, limit, remaining: r.remainingPoints,
        reset_at: new Date(Date.now() + r.msBeforeNext).toISOString(),
        retry_after_s: Math.max(1, Math.ceil(r.msBeforeNext / 1000)),
      });
    },
  );
}

const server = http.createServer((req, res) => {
  if (req.method !== 'POST' || req.url !== '/check') {
    if (req.method === 'GET' && req.url === '/healthz') return send(res, 200, { status: 'ok' });
    req.resume();
    return send(res, 404, { error: 'not-found' });
  }
  const chunks = [];
  let size = 0;
  req.on('data', (chunk) => {
    size += chunk.length;
    if (size <= MAX_BODY) chunks.push(chunk);
  });
  req.on('end', () => {
    if (size > MAX_BODY) return send(res, 413, { error: 'body-too-large' });
    decide(res, Buffer.concat(chunks).toString('utf8'));
  });
});

// Create the table once (as RateLimiterPostgres would), then listen.
new Promise((resolve, reject) => {
  new RateLimiterPostgres({ storeClient: pool, storeType: 'pool', tableName: TABLE, points: 1, duration: 1 },
    (err) => (err ? reject(err) : resolve()));
}).then(() => {
  server.keepAliveTimeout = 60_000;
  server.listen(Number(port), host, () => console.error(`peer-rlflex: listening on ${host}:${port}`));
}, (err) => {
  console.error('peer-rlflex: cannot create the table:', err);
  process.exit(1);
});

function stop() {
  server.close();
  pool.end().finally(() => process.exit(0));
  setTimeout(() => process.exit(0), 2000).unref();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
