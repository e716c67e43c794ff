// Speed of baton-locks beside the raw protocol and beside redlock over
// ioredis, on this machine. Not a test. From clients/typescript, after
// `npm run build` and `npm --prefix bench install`:
//
//   node bench/bench.mjs [seconds per row, default 3]    (ROUNDS=3: rows are
//   played in turn that many times, and each row's median is shown)
//
// Starts its own batond (BATON_BATOND, else <repo>/target/release/batond)
// and redis-server (REDIS_SERVER, else redis-server on the PATH; the redis
// rows are skipped without one) on free 127.0.0.1 ports, and stops them.
// Rows: 16 concurrent holders on 16 distinct keys (acquire + release pairs
// per second), and 16 on one key (handoffs per second: grants of the key to
// another holder than the one before; redlock lets a holder that releases
// take the key again at once, which hands nothing over). The raw row is a
// naive Node client of the protocol (no library, a write per line).

import { spawn, spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import * as net from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { connect } from '../dist/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, '..', '..', '..');
const seconds = Number(process.argv[2] ?? 3);
const WORKERS = 16;
const started = [];

function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

function startProcess(cmd, args, ready) {
  return new Promise((res, rej) => {
    const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    started.push(proc);
    let text = '';
    const timer = setTimeout(() => rej(new Error(`${cmd} did not start: ${text}`)), 10_000);
    const on = (d) => {
      text += d;
      if (ready.test(text)) {
        clearTimeout(timer);
        res(proc);
      }
    };
    proc.stdout.on('data', on);
    proc.stderr.on('data', on);
    proc.on('error', (e) => {
      clearTimeout(timer);
      rej(e);
    });
  });
}

function stopAll() {
  for (const p of started) if (p.exitCode === null) p.kill('SIGKILL');
}
process.on('exit', stopAll);

/** Run `WORKERS` loops of `one(i)` for `seconds` (after a short warm-up);
 * operations per second. With `handoffs`, only an operation by another
 * worker than the one before counts (a lock that lets its last holder take
 * it again at once hands nothing over). */
async function rate(one, handoffs = false) {
  let counting = false;
  let count = 0;
  let stop = false;
  let last = -1;
  const loops = Array.from({ length: WORKERS }, async (_, i) => {
    while (!stop) {
      await one(i, () => {
        if (counting && (!handoffs || last !== i)) count++;
        last = i;
      });
    }
  });
  await new Promise((r) => setTimeout(r, 500));
  counting = true;
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, seconds * 1000));
  counting = false;
  const elapsed = (performance.now() - t0) / 1000;
  stop = true;
  await Promise.all(loops);
  return count / elapsed;
}

/** The raw protocol: one socket, no library, requests pipelined by 16 loops. */
async function rawClient(addr) {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(':')), Number(addr.slice(addr.lastIndexOf(':') + 1))];
  const socket = net.connect({ host, port });
  socket.setNoDelay(true);
  await new Promise((r) => socket.once('connect', r));
  const waiting = new Map(); // "op key" -> resolve[] (FIFO)
  let buf = '';
  socket.on('data', (d) => {
    buf += d.toString();
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      const f = line.split(' ');
      const id = f[0] === 'A' ? `A ${f[2]}` : f[0] === 'T' ? `A ${f[1]}` : `R ${f[1]}`;
      const q = waiting.get(id);
      q.shift()(f);
      if (q.length === 0) waiting.delete(id);
    }
  });
  const ask = (id, line) =>
    new Promise((r) => {
      const q = waiting.get(id);
      if (q) q.push(r);
      else waiting.set(id, [r]);
      socket.write(line);
    });
  return {
    async pair(key) {
      const a = await ask(`A ${key}`, `A ${key} 10 0\n`);
      await ask(`R ${key}`, `R ${key} ${a[1]}\n`);
    },
    close: () => socket.destroy(),
  };
}

function row(name, value, unit) {
  console.log(`${name.padEnd(68)} ${Math.round(value).toString().padStart(8)} ${unit}`);
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function main() {
  const batond = process.env.BATON_BATOND ?? join(repo, 'target', 'release', 'batond');
  const bport = await freePort();
  await startProcess(batond, ['--bind', '127.0.0.1', '--port', String(bport), '--threads', '1'], /listening on/);
  const addr = `127.0.0.1:${bport}`;
  const rounds = Number(process.env.ROUNDS ?? 3);
  console.log(`node ${process.version}, ${WORKERS} concurrent holders, ${seconds} s per row, median of ${rounds} rounds; batond ${addr}`);

  const rows = [];
  const raw = await rawClient(addr);
  rows.push(['raw protocol, 1 socket, no library: pairs/s, distinct keys', 'pairs/s', 'rawPairs', async (i, held) => {
    await raw.pair(`raw-${i}`);
    held();
  }]);
  const client = connect(addr);
  rows.push(['baton-locks: pairs/s, distinct keys', 'pairs/s', 'batonPairs', async (i, held) => {
    const g = await client.acquire(`pairs-${i}`, { leaseMs: 10_000 });
    held();
    await g.release();
  }]);
  rows.push(['baton-locks: handoffs/s, one key (to another holder)', 'handoffs/s', 'batonHandoffs', async (i, held) => {
    const g = await client.acquire('hot', { leaseMs: 10_000 });
    held();
    await g.release();
  }, true]);

  const redisServer = process.env.REDIS_SERVER ?? 'redis-server';
  let redis = null;
  if (spawnSync(redisServer, ['--version']).status !== 0) {
    console.log('no redis-server: the redlock rows are skipped');
  } else {
    let Redis, Redlock;
    try {
      const require = createRequire(import.meta.url);
      Redis = require('ioredis');
      Redlock = require('redlock').default;
    } catch (e) {
      console.log(`redlock/ioredis not installed (npm --prefix bench install): the redlock rows are skipped`);
    }
    if (Redlock !== undefined) {
      const rport = await freePort();
      await startProcess(redisServer, ['--port', String(rport), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], /Ready to accept connections/);
      redis = new Redis({ port: rport, host: '127.0.0.1' });
      // retryCount -1: wait without limit, as the baton rows do; a short retry
      // delay is redlock's best case for handoffs (its default is 200 ms).
      const redlock = new Redlock([redis], { retryCount: -1, retryDelay: 10, retryJitter: 10 });
      redlock.on('error', () => {});
      rows.push(['redlock (ioredis, 1 redis): pairs/s, distinct keys', 'pairs/s', 'redlockPairs', async (i, held) => {
        const lock = await redlock.acquire([`pairs-${i}`], 10_000);
        held();
        await lock.release();
      }]);
      rows.push(['redlock (ioredis, 1 redis): handoffs/s, one key (to another holder)', 'handoffs/s', 'redlockHandoffs', async (i, held) => {
        const lock = await redlock.acquire(['hot'], 10_000);
        held();
        await lock.release();
      }, true]);
    }
  }

  const seen = {};
  for (let r = 0; r < rounds; r++) {
    for (const [, , name, one, handoffs] of rows) (seen[name] ??= []).push(await rate(one, handoffs));
  }
  const results = {};
  for (const [label, unit, name] of rows) {
    results[name] = median(seen[name]);
    row(label, results[name], `${unit}  (${seen[name].map(Math.round).join(', ')})`);
  }
  raw.close();
  await client.close();
  redis?.disconnect();
  if (results.redlockPairs !== undefined) {
    console.log(
      `ratios: baton-locks / redlock = ${(results.batonPairs / results.redlockPairs).toFixed(2)}x pairs, ` +
        `${(results.batonHandoffs / results.redlockHandoffs).toFixed(2)}x handoffs`,
    );
  }
  return results;
}

main()
  .then(() => {
    stopAll();
    process.exit(0);
  })
  .catch((e) => {
    console.error(e);
    stopAll();
    process.exit(1);
  });
