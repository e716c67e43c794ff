// Speed of baton-locks beside the raw protocol and beside redlock over
// ioredis, on this machine. Not a test. From clients/typescript, after
// `npm run build` and `npm --prefix bench install`:
//
//   node bench/bench.mjs [seconds per row, default 3]
//
// Starts its own batond (BATON_BATOND, else <repo>/target/release/batond)
// and redis-server (REDIS_SERVER, else redis-server on the PATH; the redis
// rows are skipped without one) on free 127.0.0.1 ports, and stops them.
// Rows: 16 concurrent holders on 16 distinct keys (acquire + release pairs
// per second), and 16 on one key (handoffs per second: grants of the key).

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

async function main() {
  const batond = process.env.BATON_BATOND ?? join(repo, 'target', 'release', 'batond');
  const bport = await freePort();
  await startProcess(batond, ['--bind', '127.0.0.1', '--port', String(bport), '--threads', '1'], /listening on/);
  const addr = `127.0.0.1:${bport}`;
  console.log(`node ${process.version}, ${WORKERS} concurrent holders, ${seconds} s per row; batond ${addr}`);
  const results = {};

  const raw = await rawClient(addr);
  results.rawPairs = await rate(async (i, held) => {
    await raw.pair(`raw-${i}`);
    held();
  });
  row('raw protocol, 1 socket: pairs/s, distinct keys', results.rawPairs, 'pairs/s');
  raw.close();

  const client = connect(addr);
  results.batonPairs = await rate(async (i, held) => {
    const g = await client.acquire(`pairs-${i}`, { leaseMs: 10_000 });
    held();
    await g.release();
  });
  row('baton-locks: pairs/s, distinct keys', results.batonPairs, 'pairs/s');
  results.batonHandoffs = await rate(async (i, held) => {
    const g = await client.acquire('hot', { leaseMs: 10_000 });
    held();
    await g.release();
  }, true);
  row('baton-locks: handoffs/s, one key (to another holder)', results.batonHandoffs, 'handoffs/s');
  await client.close();

  const redisServer = process.env.REDIS_SERVER ?? 'redis-server';
  if (spawnSync(redisServer, ['--version']).status !== 0) {
    console.log('no redis-server: the redlock rows are skipped');
  } else {
    let Redis, Redlock;
    try {
      const require = createRequire(import.meta.url);
      Redis = require('ioredis');
      Redlock = require('redlock').default;
    } catch (e) {
      console.log(`redlock/ioredis not installed (npm --prefix bench install): ${e.message}`);
      return results;
    }
    const rport = await freePort();
    await startProcess(redisServer, ['--port', String(rport), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], /Ready to accept connections/);
    const redis = new Redis({ port: rport, host: '127.0.0.1' });
    // retryCount -1: wait without limit, as the baton rows do; a short retry
    // delay is redlock's best case for handoffs (its default is 200 ms).
    const redlock = new Redlock([redis], { retryCount: -1, retryDelay: 10, retryJitter: 10 });
    redlock.on('error', () => {});
    results.redlockPairs = await rate(async (i, held) => {
      const lock = await redlock.acquire([`pairs-${i}`], 10_000);
      held();
      await lock.release();
    });
    row('redlock (ioredis, 1 redis): pairs/s, distinct keys', results.redlockPairs, 'pairs/s');
    results.redlockHandoffs = await rate(async (i, held) => {
      const lock = await redlock.acquire(['hot'], 10_000);
      held();
      await lock.release();
    }, true);
    row('redlock (ioredis, 1 redis): handoffs/s, one key (to another holder)', results.redlockHandoffs, 'handoffs/s');
    redis.disconnect();
    console.log(
      `ratios: baton-locks / redlock = ${(results.batonPairs / results.redlockPairs).toFixed(2)}x pairs, ` +
        `${(results.batonHandoffs / results.redlockHandoffs).toFixed(2)}x handoffs; ` +
        `baton-locks / raw protocol = ${(results.batonPairs / results.rawPairs).toFixed(2)}x pairs`,
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
