// The pure decisions: wire format, (op, key) matching, connection choice,
// release outcomes, argument checks.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { answerBudget, pastDeadline, releaseOutcome } from '../dist/calls.js';
import { Pending } from '../dist/pending.js';
import { choose } from '../dist/pool.js';
import { answerRoute, checkKey, checkValue, encode, normaliseAddress, parseAnswer, seconds } from '../dist/wire.js';
import { BadArgumentError, connect } from 'baton-locks';

test('durations go on the wire as seconds with up to 3 decimals', () => {
  assert.equal(seconds(30000), '30');
  assert.equal(seconds(1500), '1.5');
  assert.equal(seconds(1), '0.001');
  assert.equal(seconds(2125), '2.125');
  assert.equal(seconds(0), '0');
  assert.equal(encode({ op: 'A', key: 'k', leaseMs: 30000, waitMs: 0 }), 'A k 30 0\n');
  assert.equal(encode({ op: 'A', key: 'k', leaseMs: 500, waitMs: 1, limit: 3, value: 'me' }), 'A k 0.5 0.001 3 me\n');
  assert.equal(encode({ op: 'R', key: 'k', token: 18446744073709551615n }), 'R k 18446744073709551615\n');
});

test('tokens are parsed exactly, above 2^53 and up to 2^64-1', () => {
  const a = parseAnswer('A 18446744073709551615 job 2');
  assert.deepEqual(a, { kind: 'A', token: 18446744073709551615n, key: 'job', slot: 2 });
  const b = parseAnswer('A 9007199254740993 job');
  assert.equal(b?.kind === 'A' && b.token, 9007199254740993n);
  assert.equal(parseAnswer('A 18446744073709551616 job'), null, 'past u64');
  assert.deepEqual(parseAnswer('W k 12 1 0 -'), { kind: 'W', key: 'k', state: { token: 12n, holders: 1, waiting: 0, value: null } });
  assert.deepEqual(parseAnswer('Q k 0 0 3'), { kind: 'Q', key: 'k', token: 0n, msLeft: 0, waiting: 3 });
  assert.equal(parseAnswer('Z what'), null);
});

test('every answer names the (op, key) of its request', () => {
  assert.deepEqual(answerRoute(parseAnswer('A 7 k')!), ['A', 'k']);
  assert.deepEqual(answerRoute(parseAnswer('T k')!), ['A', 'k']);
  assert.deepEqual(answerRoute(parseAnswer('R k')!), ['R', 'k']);
  assert.deepEqual(answerRoute(parseAnswer('N k')!), ['R', 'k']);
  assert.deepEqual(answerRoute(parseAnswer('K k')!), ['K', 'k']);
  assert.deepEqual(answerRoute(parseAnswer('M h:1 K k')!), ['K', 'k']);
  assert.deepEqual(answerRoute(parseAnswer('M - A k')!), ['A', 'k']);
  assert.deepEqual(answerRoute(parseAnswer('E A k bad-lease')!), ['A', 'k']);
  assert.deepEqual(answerRoute(parseAnswer('I role=active')!), ['I', '']);
  assert.equal(answerRoute(parseAnswer('E - - too-many-connections')!), null);
});

test('answers for one (op, key) are matched in send order', () => {
  const p = new Pending<number>();
  p.push('A', 'a', 1);
  p.push('A', 'b', 2);
  p.push('A', 'a', 3);
  p.push('R', 'a', 4);
  assert.equal(p.size, 4);
  assert.equal(p.take('R', 'a')?.slot, 4);
  assert.equal(p.take('A', 'a')?.slot, 1);
  assert.equal(p.take('A', 'a')?.slot, 3);
  assert.equal(p.take('A', 'a'), undefined);
  assert.equal(p.take('A', 'b')?.slot, 2);
  assert.equal(p.size, 0);
  p.push('Q', 'x', 5);
  p.push('I', '', 6);
  assert.deepEqual(p.drain().sort(), [5, 6]);
  assert.equal(p.size, 0);
});

test('connections that are up are used in turn; down ones are left out', () => {
  const conns = [[0, 'up'], [0, 'up'], [1, 'up']] as const;
  assert.deepEqual([0, 1, 2, 3].map((t) => choose(conns, 'any', null, t)), [{ use: 0 }, { use: 1 }, { use: 2 }, { use: 0 }]);
  const mixed = [[0, 'down'], [1, 'up'], [2, 'connecting']] as const;
  for (let t = 0; t < 5; t++) assert.deepEqual(choose(mixed, 'any', null, t), { use: 1 });
  assert.equal(choose([[0, 'down'], [1, 'connecting']], 'any', null, 0), 'wait');
  assert.equal(choose([[0, 'down'], [1, 'down']], 'any', null, 0), 'nothing');
});

test('the preferred node comes first, unless it is down', () => {
  const conns = [[0, 'up'], [1, 'up'], [1, 'up']] as const;
  assert.deepEqual(choose(conns, 'any', 1, 0), { use: 1 });
  assert.deepEqual(choose(conns, 'any', 1, 1), { use: 2 });
  assert.equal(choose([[0, 'up'], [1, 'connecting']], 'any', 1, 0), 'wait');
  assert.deepEqual(choose([[0, 'up'], [1, 'down']], 'any', 1, 0), { use: 0 });
  assert.equal(choose([[0, 'up'], [1, 'down']], 1, null, 0), 'nothing');
});

test('an acquire goes where none of its key is outstanding', () => {
  const conns = [[0, 'up', true], [0, 'up', false], [0, 'down', false]] as const;
  for (let t = 0; t < 4; t++) assert.deepEqual(choose(conns, 'any', null, t), { use: 1 });
  // Every one busy: still sent, round-robin.
  const busy = [[0, 'up', true], [0, 'up', true]] as const;
  assert.deepEqual([0, 1].map((t) => choose(busy, 'any', null, t)), [{ use: 0 }, { use: 1 }]);
  // A free connection elsewhere does not beat the preferred node (it would
  // only redirect back).
  assert.deepEqual(choose([[0, 'up', false], [1, 'up', true]], 'any', 1, 0), { use: 1 });
});

test('an acquire whose key every up connection is busy with waits for one still connecting', () => {
  // The only one up is busy and the other still connecting (a new client's
  // second): wait for it; with none connecting, the busy one at once.
  assert.equal(choose([[0, 'up', true], [0, 'connecting', false]], 'any', null, 0), 'wait');
  assert.equal(choose([[0, 'up', true], [0, 'connecting', false]], 0, null, 0), 'wait');
  assert.deepEqual(choose([[0, 'up', true], [0, 'down', false]], 'any', null, 0), { use: 0 });
  // After the wait: the one that came up (free), else (the wait over, the
  // pool asks again without the key) the busy one after all.
  assert.deepEqual(choose([[0, 'up', true], [0, 'up', false]], 'any', null, 0), { use: 1 });
  assert.deepEqual(choose([[0, 'up'], [0, 'connecting']], 'any', null, 0), { use: 0 });
  // The preferred node's: waited for, not traded for a free one elsewhere.
  assert.equal(choose([[0, 'up', false], [1, 'up', true], [1, 'connecting', false]], 'any', 1, 0), 'wait');
});

test('a request held back never makes its connection overdue', () => {
  const s = 1000;
  assert.equal(pastDeadline(60 * s, 5 * s, null, null), null);
  assert.equal(pastDeadline(6 * s, 5 * s, null, 5 * s), 'held-back');
  assert.equal(pastDeadline(14 * s, 5 * s, 10 * s, null), null);
  assert.equal(pastDeadline(15 * s, 5 * s, 10 * s, null), 'conn-overdue');
  assert.equal(pastDeadline(14 * s, 5 * s, 10 * s, 12 * s), 'caller-overdue');
  assert.equal(pastDeadline(99 * s, null, 0, null), null);
});

test('the pending table knows the front of each line', () => {
  const p = new Pending<number>();
  assert.equal(p.push('A', 'a', 1), true);
  assert.equal(p.push('A', 'a', 2), false);
  assert.equal(p.has('A', 'a'), true);
  assert.equal(p.has('R', 'a'), false);
  assert.deepEqual(p.front('A', 'a'), { slot: 1 });
  p.take('A', 'a');
  assert.deepEqual(p.front('A', 'a'), { slot: 2 });
  p.take('A', 'a');
  assert.equal(p.has('A', 'a'), false);
});

test('N after an attempt that may have got through counts as released', () => {
  const n = parseAnswer('N k')!;
  assert.equal(releaseOutcome({ answer: n, sentAt: 0, earlierMaybeDelivered: false }, false), 'not-held');
  assert.equal(releaseOutcome({ answer: n, sentAt: 0, earlierMaybeDelivered: true }, false), 'released');
  assert.equal(releaseOutcome({ answer: n, sentAt: 0, earlierMaybeDelivered: false }, true), 'released');
  assert.equal(releaseOutcome({ answer: parseAnswer('R k')!, sentAt: 0, earlierMaybeDelivered: false }, false), 'released');
});

test('an acquire has its wait plus the request timeout; one without a limit has none', () => {
  assert.equal(answerBudget({ op: 'A', key: 'k', leaseMs: 1000, waitMs: 0 }, 5000), null);
  assert.equal(answerBudget({ op: 'A', key: 'k', leaseMs: 1000, waitMs: 2000 }, 5000), 7000);
  assert.equal(answerBudget({ op: 'I' }, 5000), 5000);
});

test('arguments are checked before anything is sent', async () => {
  assert.throws(() => checkKey(''), BadArgumentError);
  assert.throws(() => checkKey('a b'), BadArgumentError);
  assert.throws(() => checkKey('x'.repeat(251)), BadArgumentError);
  assert.throws(() => checkKey('\ud800'), BadArgumentError);
  assert.equal(checkKey('日本'), '日本');
  assert.throws(() => checkValue('-'), BadArgumentError);
  assert.equal(normaliseAddress(' lock-1 '), 'lock-1:7373');
  assert.equal(normaliseAddress('[::1]'), '[::1]:7373');
  for (const bad of ['', 'a:x', ':1', 'a:70000', 'a b:1', '::1']) assert.throws(() => normaliseAddress(bad), BadArgumentError, bad);
  assert.throws(() => connect([]), BadArgumentError);
  assert.throws(() => connect('127.0.0.1:1', { auth: 'short' }), (e: unknown) => e instanceof BadArgumentError && !e.message.includes('short'));
  const client = connect('127.0.0.1:1');
  try {
    await assert.rejects(client.acquire('a b', { leaseMs: 1000 }), { code: 'bad-argument' });
    await assert.rejects(client.acquire('k', { leaseMs: 0 }), { code: 'bad-argument' });
    await assert.rejects(client.acquire('k', { leaseMs: 1000, limit: 0 }), { code: 'bad-argument' });
    await assert.rejects(client.acquire('k', { leaseMs: 1000, limit: 10001 }), { code: 'bad-argument' });
    await assert.rejects(client.release('k', 0n), { code: 'bad-argument' });
  } finally {
    await client.close();
  }
});
