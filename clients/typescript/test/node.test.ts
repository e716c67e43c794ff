// The client against a real batond: locks, semaphores, hold, watches,
// elections, auth, and a script that exits on its own after close().

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { LostError, RefusedError, TimeoutError, connect } from 'baton-locks';
import { DEADLINE_MS, Node, REPO, killAll, tmpDir, waitFor } from './helpers.js';

let node: Node;

before(async () => {
  node = await Node.start();
});

after(() => killAll());

test('acquire, query and release, with tokens above 2^53 kept exact', async () => {
  await using client = connect(node.addr);
  const g = await client.acquire('job', { leaseMs: 5000, waitMs: 1000 });
  assert.equal(typeof g.token, 'bigint');
  assert.ok(g.token > 2n ** 53n, `token ${g.token} is above 2^53`);
  assert.equal(g.slot, 0);
  const q = await client.query('job');
  assert.equal(q.token, g.token, 'the server names exactly the token it granted');
  assert.ok(q.msLeft > 0 && q.msLeft <= 5000);
  await g.release();
  assert.equal((await client.query('job')).token, 0n);
  const next = await client.acquire('job', { leaseMs: 5000 });
  assert.ok(next.token > g.token, 'tokens only grow');
  // release by key and token; a second time the token holds nothing
  assert.equal(await client.release('job', next.token), true);
  assert.equal(await client.release('job', next.token), false);
  const info = await client.info(node.addr);
  assert.equal(info['role'], 'active');
  assert.ok(BigInt(info['token']!) >= next.token);
});

test('a wait that runs out is TimeoutError; a wait of 0 is a try; await using releases', async () => {
  await using client = connect(node.addr);
  {
    await using g = await client.acquire('busy', { leaseMs: 10_000 });
    await assert.rejects(client.acquire('busy', { leaseMs: 1000, waitMs: 0 }), TimeoutError);
    await assert.rejects(client.acquire('busy', { leaseMs: 1000, waitMs: 150 }), { code: 'timeout' });
    assert.equal((await client.query('busy')).token, g.token);
  }
  assert.equal((await client.query('busy')).token, 0n, 'released at the end of the block');
});

test('a try-acquire behind the client\'s own waiter times out, and the waiter keeps its place', async () => {
  await using client = connect(node.addr);
  await using other = connect(node.addr);
  const holder = await other.acquire('own', { leaseMs: 30_000 });
  const first = client.acquire('own', { leaseMs: 30_000 });
  await waitFor('the first waiter', async () => (await other.query('own')).waiting === 1);
  // Two in a row: round-robin alone would put one of them behind the
  // waiter, where the server holds its T back until the waiter is answered
  // (and the connection, deemed dead, would be closed).
  for (let i = 0; i < 2; i++) await assert.rejects(client.acquire('own', { leaseMs: 30_000, waitMs: 0 }), TimeoutError);
  let secondDone = false;
  const second = other.acquire('own', { leaseMs: 30_000 }).finally(() => (secondDone = true));
  await waitFor('the second waiter', async () => (await other.query('own')).waiting === 2);
  await holder.release();
  const g1 = await first;
  assert.ok(g1.token > holder.token);
  assert.equal(secondDone, false, 'the first waiter kept its place');
  await g1.release();
  const g2 = await second;
  assert.ok(g2.token > g1.token);
  await g2.release();
});

test('a try-acquire held back on every connection times out without closing one', async () => {
  // A short request timeout: the try-acquire's answer is due within it
  // (plus its wait), by which time the server still holds it back.
  await using client = connect(node.addr, { requestTimeoutMs: 300 });
  await using other = connect(node.addr);
  const holder = await other.acquire('full', { leaseMs: 30_000 });
  // One waiter of the client on each of its two connections, another
  // client's behind them.
  const waiters = [];
  for (const [c, n] of [[client, 1], [client, 2], [other, 3]] as const) {
    waiters.push(c.acquire('full', { leaseMs: 30_000 }));
    await waitFor(`waiter ${n}`, async () => (await other.query('full')).waiting === n);
  }
  await assert.rejects(client.acquire('full', { leaseMs: 30_000, waitMs: 0 }), TimeoutError);
  // Had a connection been closed, its waiter would have been sent again,
  // behind the third.
  await holder.release();
  let last = holder.token;
  for (const waiter of waiters) {
    const g = await waiter;
    assert.ok(g.token > last);
    last = g.token;
    await g.release();
  }
});

test('a waiter gets the key when the holder releases; an aborted waiter leaks nothing', async () => {
  await using client = connect(node.addr);
  const first = await client.acquire('line', { leaseMs: 10_000 });
  const waiting = client.acquire('line', { leaseMs: 10_000, waitMs: 5000 });
  await waitFor('a waiter', async () => (await client.query('line')).waiting === 1);
  await first.release();
  const second = await waiting;
  assert.ok(second.token > first.token);
  const controller = new AbortController();
  const aborted = client.acquire('line', { leaseMs: 10_000, signal: controller.signal });
  await waitFor('a waiter', async () => (await client.query('line')).waiting === 1);
  controller.abort();
  await assert.rejects(aborted, { name: 'AbortError' });
  await second.release();
  // The grant handed to the aborted request is released at once.
  await waitFor('the key free again', async () => (await client.query('line')).token === 0n);
});

test('semaphores: slots, values, limit-mismatch', async () => {
  await using client = connect(node.addr);
  const a = await client.acquire('gpu', { leaseMs: 10_000, limit: 2, value: 'host-a' });
  const b = await client.acquire('gpu', { leaseMs: 10_000, limit: 2, value: 'host-b' });
  assert.deepEqual([a.slot, b.slot].sort(), [0, 1]);
  await assert.rejects(client.acquire('gpu', { leaseMs: 1000, waitMs: 0, limit: 2 }), TimeoutError);
  await assert.rejects(client.acquire('gpu', { leaseMs: 1000, waitMs: 0, limit: 3 }), (e: unknown) => e instanceof RefusedError && e.reason === 'limit-mismatch');
  await assert.rejects(client.acquire('gpu', { leaseMs: 1000, waitMs: 0 }), { code: 'refused', reason: 'limit-mismatch' });
  const freed = a.slot;
  await a.release();
  const c = await client.acquire('gpu', { leaseMs: 10_000, limit: 2 });
  assert.equal(c.slot, freed, 'the freed slot');
  await b.release();
  await c.release();
});

test('a refused lease is RefusedError with the reason word', async () => {
  await using client = connect(node.addr);
  await assert.rejects(client.acquire('k', { leaseMs: 10 ** 12 }), { code: 'refused', reason: 'lease-too-long' });
});

test('a held grant outlives its lease, keep works, and a grant taken from it is lost', async () => {
  await using client = connect(node.addr);
  const held = await client.hold('held', { leaseMs: 600 });
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal((await client.query('held')).token, held.token, 'kept alive past its lease');
  await held.keep(2000);
  // Someone releases its token behind its back: the next keep says not-held.
  assert.equal(await client.release('held', held.token), true);
  const why = await held.lost;
  assert.ok(why instanceof LostError);
  assert.ok(held.signal.aborted);
  await assert.rejects(held.release(), LostError);
});

// close() releases a held key this same client waits for: the server hands
// it to the client's own waiter, a grant that comes to a call close ended.
// It is released before the sockets close, so the key is free as soon as
// close() resolves (it stayed held for its lease in about one close in four).
test('close leaves no grant its own release handed to its own waiter', async () => {
  await using observer = connect(node.addr);
  for (let i = 0; i < 20; i++) {
    const key = `handed-${i}`;
    const client = connect(node.addr);
    await client.hold(key, { leaseMs: 60_000 });
    const waiter = client.acquire(key, { leaseMs: 60_000 });
    waiter.catch(() => {});
    await waitFor('the waiter in line', async () => (await observer.query(key)).waiting === 1);
    await client.close();
    await assert.rejects(waiter, { code: 'closed' });
    const q = await observer.query(key);
    assert.equal(q.token, 0n, `close ${i}: the key is free`);
    assert.equal(q.waiting, 0);
  }
});

test('watch yields the state now, then each change, and ends on break', async () => {
  await using client = connect(node.addr);
  const watch = client.watch('watched');
  const seen: bigint[] = [];
  const g = await (async () => {
    const it = watch[Symbol.asyncIterator]();
    const first = await it.next();
    assert.equal(first.done, false);
    assert.equal(first.value!.token, 0n);
    assert.equal(first.value!.value, null);
    const grant = await client.acquire('watched', { leaseMs: 5000, limit: 1, value: 'me' });
    const second = await it.next();
    assert.equal(second.value!.token, grant.token);
    assert.equal(second.value!.holders, 1);
    assert.equal(second.value!.value, 'me');
    seen.push(second.value!.token);
    return grant;
  })();
  await g.release();
  for await (const state of watch) {
    assert.equal(state.token, 0n);
    break;
  }
  assert.equal(watch.isEnded, true);
  assert.equal((await watch.next()).done, true);
});

test('campaign, leader and observe', async () => {
  await using client = connect(node.addr);
  assert.equal((await client.leader('election')).token, 0n);
  const controller = new AbortController();
  const changes = client.observe('election', { signal: controller.signal });
  const a = await client.campaign('election', 'node-a', { leaseMs: 5000 });
  const leader = await client.leader('election');
  assert.equal(leader.token, a.token);
  assert.equal(leader.value, 'node-a');
  const b = client.campaign('election', 'node-b', { leaseMs: 5000 });
  await a.release();
  const bGrant = await b;
  const tokens: bigint[] = [];
  for await (const s of changes) {
    tokens.push(s.token);
    if (s.token === bGrant.token) controller.abort();
  }
  assert.ok(tokens.includes(bGrant.token));
  assert.equal(new Set(tokens).size, tokens.length, 'observe yields each leader once');
  await bGrant.release();
});

test('auth: the right secret works, a wrong one is refused bad-auth', async () => {
  const dir = tmpDir();
  const file = join(dir, 'auth');
  const secret = 'a-secret-of-enough-bytes';
  writeFileSync(file, secret + '\n', { mode: 0o600 });
  const guarded = await Node.start(['--auth-file', file]);
  try {
    await using good = connect(guarded.addr, { auth: secret });
    const g = await good.acquire('k', { leaseMs: 1000 });
    await g.release();
    await using bad = connect(guarded.addr, { auth: 'not-the-secret-at-all' });
    await assert.rejects(bad.query('k'), { code: 'refused', reason: 'bad-auth' });
    await using none = connect(guarded.addr);
    await assert.rejects(none.query('k'), { code: 'refused', reason: 'auth-required' });
  } finally {
    guarded.kill();
  }
});

test('a script that uses the client and closes it exits on its own, promptly', async () => {
  const dir = tmpDir();
  const script = join(dir, 'script.mjs');
  const index = join(REPO, 'clients', 'typescript', 'dist', 'index.js');
  writeFileSync(
    script,
    `import { connect } from ${JSON.stringify(index)};
const client = connect(${JSON.stringify(node.addr)});
const held = await client.hold('script', { leaseMs: 3000 });
const w = client.watch('script');
await w.next();
const g = await client.acquire('script2', { leaseMs: 3000 });
await g.release();
await client.leader('script');
await client.close();
console.log(JSON.stringify(process.getActiveResourcesInfo()));
`,
  );
  const started = Date.now();
  const child = spawn(process.execPath, [script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  const code = await new Promise<number | null>((resolve) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      resolve(null);
    }, DEADLINE_MS);
    child.on('exit', (c) => {
      clearTimeout(timer);
      resolve(c);
    });
  });
  assert.equal(code, 0, `the script exits by itself (after ${Date.now() - started} ms)`);
  // Nothing of the client is left once close() resolves: no socket, no timer.
  const left: string[] = JSON.parse(out.trim());
  assert.deepEqual(left.filter((r) => /TCP|TLS|Timeout|Immediate/.test(r)), [], `left open: ${left}`);
  await using client = connect(node.addr);
  assert.equal((await client.query('script')).token, 0n, 'its held grant was released by close()');
});
