// A real 2-node cluster: redirects from the standby, and failover after the
// active is killed (SIGKILL): the client keeps working, watches follow.

import assert from 'node:assert/strict';
import { after, test } from 'node:test';

import { connect } from 'baton-locks';
import { killAll, startPair, waitFor } from './helpers.js';

after(() => killAll());

test('the client follows a standby redirect to the active', async () => {
  const [active, standby] = await startPair();
  try {
    await using client = connect(standby.addr);
    const g = await client.acquire('redirected', { leaseMs: 5000, waitMs: 5000 });
    assert.ok(client.servers.includes(active.addr), 'learned from the redirect');
    assert.equal((await client.query('redirected')).token, g.token);
    await g.release();
  } finally {
    active.kill();
    standby.kill();
  }
});

test('failover after SIGKILL of the active: calls, held grants and watches go on', async () => {
  const [active, standby] = await startPair();
  try {
    await using client = connect([active.addr, standby.addr]);
    const first = await client.acquire('before', { leaseMs: 30_000, waitMs: 5000 });
    const held = await client.hold('kept', { leaseMs: 3000 });
    const watch = client.watch('before');
    const it = watch[Symbol.asyncIterator]();
    assert.equal((await it.next()).value!.token, first.token);
    // Replication is asynchronous: kill the active once the standby holds both grants.
    await waitFor('the grants on the standby', async () => Number((await standby.info())?.['held'] ?? 0) >= 2);
    active.kill();
    await waitFor('the standby promoted', async () => (await standby.info())?.['role'] === 'active');
    assert.equal((await client.query('before')).token, first.token, 'the replicated grant is still held');
    const second = await client.acquire('after', { leaseMs: 30_000, waitMs: 5000 });
    assert.ok(second.token > first.token, 'tokens only grow');
    // The watch re-watches on the new active and yields its state.
    const again = await it.next();
    assert.equal(again.value!.token, first.token);
    await first.release();
    assert.equal((await it.next()).value!.token, 0n);
    await watch.return();
    // The held grant was kept alive through the failover.
    await new Promise((r) => setTimeout(r, 3500));
    assert.equal((await client.query('kept')).token, held.token);
    assert.equal(held.isLost, false);
    await held.release();
    await second.release();
  } finally {
    active.kill();
    standby.kill();
  }
});
