// Section 4's decisions against an in-process scripted server: pending
// matching, two connections and round robin, acquire failover, release
// retries, redirects, liveness probes, aborts, auth, held grants.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { type Client, ClosedError, LostError, RefusedError, TimeoutError, UnavailableError, connect } from 'baton-locks';
import { FakeServer, waitFor } from './helpers.js';

function leaseMs(line: string): number {
  return Math.round(Number(line.split(' ')[2]) * 1000);
}

async function bothUp(client: Client, count = 2): Promise<void> {
  await waitFor('connections up', () => client.connections().filter((c) => c.connected).length === count);
}

test('answers are matched by (op, key) in send order, across keys out of order', async () => {
  const held = new Map<number, string[]>();
  let total = 0;
  const fake = await new FakeServer((conn, line, server) => {
    if (!line.startsWith('A ')) return;
    const list = held.get(conn.index) ?? [];
    list.push(line);
    held.set(conn.index, list);
    if (++total < 6) return;
    for (const c of server.conns) {
      const lines = held.get(c.index) ?? [];
      // Every y first, then every x: out of order across keys, in order per key.
      for (const key of ['y', 'x']) {
        for (const l of lines.filter((l) => l.split(' ')[1] === key)) c.send(`A ${leaseMs(l) * 1000} ${key}`);
      }
    }
  }).start();
  const client = connect(fake.addr);
  try {
    await bothUp(client);
    const calls = [
      ['x', 1001],
      ['y', 1002],
      ['x', 1003],
      ['y', 1004],
      ['x', 1005],
      ['x', 1006],
    ] as const;
    const grants = await Promise.all(calls.map(([key, lease]) => client.acquire(key, { leaseMs: lease })));
    grants.forEach((g, i) => {
      assert.equal(g.key, calls[i]![0]);
      assert.equal(g.token, BigInt(calls[i]![1] * 1000));
    });
  } finally {
    await client.close();
    await fake.close();
  }
});

test('one address gets two connections, used in turn', async () => {
  const fake = await new FakeServer((conn, line) => {
    if (line.startsWith('Q ')) conn.send(`Q ${line.split(' ')[1]} 0 0 0`);
  }).start();
  const client = connect(fake.addr);
  try {
    await bothUp(client);
    assert.equal(fake.conns.length, 2);
    for (let i = 0; i < 8; i++) await client.query('k');
    const order = fake.seen.filter((s) => s.line.startsWith('Q')).map((s) => s.conn);
    assert.equal(order.length, 8);
    for (let i = 1; i < order.length; i++) assert.notEqual(order[i], order[i - 1], `round robin: ${order}`);
  } finally {
    await client.close();
    await fake.close();
  }
});

test('an acquire whose connection drops moves to the next connection', async () => {
  let dropped = false;
  const fake = await new FakeServer((conn, line) => {
    if (!line.startsWith('A ')) return;
    if (!dropped) {
      dropped = true;
      conn.socket.destroy();
      return;
    }
    conn.send('A 77 job');
  }).start();
  const client = connect(fake.addr);
  try {
    await bothUp(client);
    const g = await client.acquire('job', { leaseMs: 5000 });
    assert.equal(g.token, 77n);
    const acquires = fake.seen.filter((s) => s.line.startsWith('A '));
    assert.equal(acquires.length, 2);
    assert.notEqual(acquires[0]!.conn, acquires[1]!.conn);
  } finally {
    await client.close();
    await fake.close();
  }
});

test('an acquire fails unavailable after as many failed attempts as connections', async () => {
  const fake = await new FakeServer((conn, line) => {
    if (line.startsWith('A ')) conn.socket.destroy();
  }).start();
  const client = connect(fake.addr);
  try {
    await bothUp(client);
    await assert.rejects(client.acquire('job', { leaseMs: 5000 }), UnavailableError);
    assert.equal(fake.seen.filter((s) => s.line.startsWith('A ')).length, 2);
  } finally {
    await client.close();
    await fake.close();
  }
});

test('a release whose connection drops is sent again at once on another; N then means released', async () => {
  let first = true;
  const fake = await new FakeServer((conn, line) => {
    if (line.startsWith('A ')) conn.send('A 5 job');
    if (line.startsWith('R ')) {
      if (first) {
        first = false;
        conn.socket.destroy();
      } else conn.send('N job');
    }
  }).start();
  const client = connect(fake.addr);
  try {
    await bothUp(client);
    const g = await client.acquire('job', { leaseMs: 5000 });
    await g.release();
    assert.equal(g.isReleased, true);
    const releases = fake.seen.filter((s) => s.line === 'R job 5');
    assert.equal(releases.length, 2);
    assert.notEqual(releases[0]!.conn, releases[1]!.conn);
    await assert.rejects(g.release(), { code: 'closed' });
  } finally {
    await client.close();
    await fake.close();
  }
});

test('N to the first release attempt means the grant was lost', async () => {
  const fake = await new FakeServer((conn, line) => {
    if (line.startsWith('A ')) conn.send('A 5 job');
    if (line.startsWith('R ')) conn.send('N job');
  }).start();
  const client = connect(fake.addr);
  try {
    const g = await client.acquire('job', { leaseMs: 5000 });
    await assert.rejects(g.release(), LostError);
    await assert.rejects(g.release(), LostError);
  } finally {
    await client.close();
    await fake.close();
  }
});

test('a release is retried every 200 ms while no connection is up, until one comes back', async () => {
  let cut = false;
  const fake = await new FakeServer((conn, line, server) => {
    if (line.startsWith('A ')) conn.send('A 5 job');
    if (line.startsWith('R ')) {
      if (!cut) {
        cut = true;
        for (const c of server.conns) c.socket.destroy();
      } else conn.send('N job');
    }
  }).start();
  const client = connect(fake.addr);
  try {
    await bothUp(client);
    const g = await client.acquire('job', { leaseMs: 10000 });
    await g.release(); // the connections come back by the 3 s reconnect
    const releases = fake.seen.filter((s) => s.line === 'R job 5');
    assert.equal(releases.length, 2);
    assert.ok(releases[1]!.conn >= 2, 'sent on a new connection');
  } finally {
    await client.close();
    await fake.close();
  }
});

test('M host:port is followed, and the new node registered and preferred', async () => {
  const active = await new FakeServer((conn, line) => {
    const [op, key] = line.split(' ');
    if (op === 'A') conn.send(`A 9 ${key}`);
    if (op === 'Q') conn.send(`Q ${key} 9 100 0`);
  }).start();
  let noActive = 2;
  const standby = await new FakeServer((conn, line) => {
    const [op, key] = line.split(' ');
    if (op === 'I') return;
    if (noActive-- > 0) conn.send(`M - ${op} ${key}`);
    else conn.send(`M ${active.addr} ${op} ${key}`);
  }).start();
  const client = connect([standby.addr]);
  try {
    const g = await client.acquire('job', { leaseMs: 5000 });
    assert.equal(g.token, 9n);
    assert.ok(client.servers.includes(active.addr));
    assert.equal(standby.seen.filter((s) => s.line.startsWith('A ')).length, 3, 'M - twice, then the redirect');
    const q = await client.query('job');
    assert.equal(q.token, 9n);
    assert.equal(standby.seen.filter((s) => s.line.startsWith('Q ')).length, 0, 'the active is preferred now');
  } finally {
    await client.close();
    await active.close();
    await standby.close();
  }
});

test('a grant that arrives after the abort is released at once', async () => {
  let waiting: (() => void) | null = null;
  const fake = await new FakeServer((conn, line) => {
    if (line.startsWith('A ')) waiting = () => conn.send('A 41 job');
  }).start();
  const client = connect(fake.addr);
  try {
    const controller = new AbortController();
    const acquiring = client.acquire('job', { leaseMs: 5000, signal: controller.signal });
    await waitFor('the acquire', () => waiting !== null);
    controller.abort();
    await assert.rejects(acquiring, { name: 'AbortError' });
    waiting!();
    await fake.waitSeen('the release of the late grant', () => fake.seen.some((s) => s.line === 'R job 41'));
  } finally {
    await client.close();
    await fake.close();
  }
});

test('a silent connection with a request waiting is probed with I, then closed', async () => {
  const fake = await new FakeServer(() => {}).start();
  const client = connect(fake.addr, { requestTimeoutMs: 300 });
  try {
    await bothUp(client);
    const acquiring = client.acquire('job', { leaseMs: 5000 }).catch((e: unknown) => e);
    await fake.waitSeen('a probe', () => fake.seen.some((s) => s.line === 'I'));
    const probed = fake.seen.find((s) => s.line === 'I')!.conn;
    const acquiredOn = fake.seen.find((s) => s.line.startsWith('A '))!.conn;
    assert.equal(probed, acquiredOn);
    // Unanswered, the probe closes the connection: the acquire moves on.
    await fake.waitSeen('the acquire on the other connection', () => fake.seen.filter((s) => s.line.startsWith('A ')).length >= 2);
    await client.close();
    assert.ok((await acquiring) instanceof Error);
  } finally {
    await client.close();
    await fake.close();
  }
});

test('a try-acquire behind the client\'s own waiter goes on the connection still connecting, once it is up', async () => {
  // The second connection's U is answered only when the test says: until
  // then it is connecting, and the first (up) has the waiter of k.
  const secret = 's'.repeat(20);
  const held: { send: (line: string) => void }[] = [];
  const fake = await new FakeServer((conn, line) => {
    if (line.startsWith('U ')) {
      if (conn.index === 1) held.push(conn);
      else conn.send('U ok');
      return;
    }
    // The try-acquire (lease 20 s) is refused; the waiter (30 s) waits.
    if (line.startsWith('A k 20 ')) conn.send('T k');
  }).start();
  const client = connect(fake.addr, { auth: secret });
  try {
    await fake.waitSeen('U on both connections', () => fake.seen.filter((s) => s.line.startsWith('U ')).length === 2);
    await waitFor('the first connection up', () => client.connections().filter((c) => c.connected).length === 1);
    const waiter = client.acquire('k', { leaseMs: 30_000, waitMs: 60_000 }).catch((e: unknown) => e);
    await fake.waitSeen('the waiter', () => fake.seen.some((s) => s.line.startsWith('A k 30 ')));
    const trying = client.acquire('k', { leaseMs: 20_000, waitMs: 0 }).catch((e: unknown) => e);
    // The choice is made within the call; one turn of the loop sends what it chose.
    await new Promise((resolve) => setImmediate(resolve));
    held[0]!.send('U ok');
    await fake.waitSeen('the try-acquire', () => fake.seen.some((s) => s.line.startsWith('A k 20 ')));
    assert.deepEqual(
      fake.seen.filter((s) => s.line.startsWith('A ')).map((s) => [s.conn, s.line.split(' ')[2]]),
      [
        [0, '30'],
        [1, '20'],
      ],
    );
    assert.ok((await trying) instanceof TimeoutError);
    await client.close();
    assert.ok((await waiter) instanceof ClosedError);
  } finally {
    await client.close();
    await fake.close();
  }
});

test('U <secret> goes first on every connection; a refused secret is RefusedError bad-auth', async () => {
  const secret = 's'.repeat(20);
  const fake = await new FakeServer((conn, line) => {
    if (conn.lines.length === 1) {
      if (line === `U ${secret}`) conn.send('U ok');
      else {
        conn.send('E - - bad-auth');
        conn.socket.end();
      }
      return;
    }
    if (line.startsWith('Q ')) conn.send('Q k 0 0 0');
  }).start();
  const good = connect(fake.addr, { auth: secret });
  const bad = connect(fake.addr, { auth: 'x'.repeat(20) });
  try {
    await good.query('k');
    await bothUp(good);
    await assert.rejects(bad.query('k'), (e: unknown) => e instanceof RefusedError && e.reason === 'bad-auth');
    await waitFor('a first line on every connection', () => fake.conns.every((c) => c.lines.length > 0));
    for (const c of fake.conns) assert.match(c.lines[0]!, /^U /);
  } finally {
    await good.close();
    await bad.close();
    await fake.close();
  }
});

test('a held grant whose keep is answered not-held is lost at once: promise, signal, event', async () => {
  const fake = await new FakeServer((conn, line) => {
    if (line.startsWith('A ')) conn.send('A 5 job');
    if (line.startsWith('K ')) conn.send('E K job not-held');
  }).start();
  const client = connect(fake.addr);
  try {
    const g = await client.hold('job', { leaseMs: 600 });
    let evented = false;
    g.on('lost', () => (evented = true));
    const why = await g.lost;
    assert.ok(why instanceof LostError);
    assert.equal(g.signal.aborted, true);
    assert.equal(g.signal.reason, why);
    assert.equal(evented, true);
    await assert.rejects(g.release(), LostError);
    await assert.rejects(g.keep(1000), LostError);
    assert.equal(fake.seen.filter((s) => s.line.startsWith('A ')).length, 1, 'never acquired again');
  } finally {
    await client.close();
    await fake.close();
  }
});

test('a held grant is lost when its lease runs out before a keep gets through', async () => {
  let server: FakeServer | null = null;
  const fake = await new FakeServer((conn, line, s) => {
    server = s;
    if (line.startsWith('A ')) conn.send('A 5 job');
    // Keeps go unanswered and their connections die.
    if (line.startsWith('K ')) conn.socket.destroy();
  }).start();
  const client = connect(fake.addr);
  try {
    const g = await client.hold('job', { leaseMs: 900 });
    const why = await g.lost;
    assert.ok(why instanceof LostError);
    assert.ok(server !== null);
    assert.ok(fake.seen.filter((s) => s.line.startsWith('K ')).length >= 2, 'keeps were retried');
  } finally {
    await client.close();
    await fake.close();
  }
});

test('close() releases held grants once and fails later calls closed', async () => {
  const fake = await new FakeServer((conn, line) => {
    const [op, key] = line.split(' ');
    if (op === 'A') conn.send(`A 5 ${key}`);
    if (op === 'R') conn.send(`R ${key}`);
    if (op === 'W') conn.send(`W ${key} 0 0 0 -`);
  }).start();
  const client = connect(fake.addr);
  const g = await client.hold('job', { leaseMs: 5000 });
  const w = client.watch('other');
  const first = await w.next();
  assert.equal(first.done, false);
  let lostEvent = false;
  g.on('lost', () => (lostEvent = true));
  await client.close();
  await fake.waitSeen('the release', () => fake.seen.some((s) => s.line === 'R job 5'));
  assert.equal((await w.next()).done, true);
  await assert.rejects(g.release(), { code: 'closed' });
  await assert.rejects(client.query('job'), { code: 'closed' });
  assert.throws(() => client.watch('job'), { code: 'closed' });
  assert.equal(lostEvent, false);
  await fake.close();
});

test('a grant answered after more than a third of its lease is confirmed at once with K', async () => {
  const fake = await new FakeServer((conn, line) => {
    const [op, key] = line.split(' ');
    if (op === 'A') setTimeout(() => conn.send(`A 8 ${key}`), 500);
    if (op === 'K') conn.send(`K ${key}`);
  }).start();
  const client = connect(fake.addr);
  try {
    const g = await client.acquire('slow', { leaseMs: 900 });
    assert.equal(g.token, 8n);
    const keeps = fake.seen.filter((s) => s.line.startsWith('K slow 8 '));
    assert.equal(keeps.length, 1, 'confirmed before the grant was handed over');
    assert.equal(keeps[0]!.line, 'K slow 8 0.9');
  } finally {
    await client.close();
    await fake.close();
  }
});

test('close() while a grant is confirmed with K releases it before the sockets close; the acquire fails closed', async () => {
  let answerK: (() => void) | null = null;
  const fake = await new FakeServer((conn, line) => {
    const [op, key] = line.split(' ');
    // It waited in line: half its lease.
    if (op === 'A') setTimeout(() => conn.send(`A 5 ${key}`), 150);
    if (op === 'K') answerK = () => conn.send(`K ${key}`);
    if (op === 'R') conn.send(`R ${key}`);
  }).start();
  const client = connect(fake.addr);
  try {
    const acquired = client.acquire('k', { leaseMs: 300 }).then(
      (g) => `granted ${g.token} on a closed client`,
      (e: unknown) => e,
    );
    await fake.waitSeen('the confirming K', () => answerK !== null);
    const closed = client.close();
    answerK!();
    await closed;
    const outcome = await acquired;
    assert.ok(outcome instanceof ClosedError, `the acquire: ${String(outcome)}`);
    const releases = fake.seen.filter((s) => s.line.startsWith('R '));
    assert.deepEqual(
      releases.map((s) => s.line),
      ['R k 5'],
      'the grant released before the sockets closed',
    );
  } finally {
    await client.close();
    await fake.close();
  }
});
