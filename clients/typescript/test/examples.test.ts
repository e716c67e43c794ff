// The examples of the README and docs/clients.md run unchanged against a node.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';

import { DEADLINE_MS, Node, REPO, killAll } from './helpers.js';

const run = promisify(execFile);
const examples = join(REPO, 'clients', 'typescript', 'examples');
let node: Node;

before(async () => {
  node = await Node.start();
});

after(() => killAll());

async function example(name: string): Promise<string> {
  const { stdout } = await run(process.execPath, [join(examples, name)], {
    env: { ...process.env, BATON_SERVERS: node.addr },
    timeout: DEADLINE_MS,
  });
  return stdout;
}

test('lock.mjs: a lock around a job', async () => {
  assert.match(await example('lock.mjs'), /^got it, token \d+$/m);
});

test('semaphore.mjs: a slot of a semaphore', async () => {
  assert.match(await example('semaphore.mjs'), /^encoder slot 0 of 4, token \d+$/m);
});

test('election.mjs: campaign, leader, observe, resign', async () => {
  const out = await example('election.mjs');
  assert.match(out, /^I lead with token \d+$/m);
  assert.match(out, /^leader now: 10\.0\.0\.7:8080$/m);
  assert.match(out, /^leader: 10\.0\.0\.7:8080 \(token \d+\)$/m);
});

test('errors.mjs: a refusal with its reason', async () => {
  assert.match(await example('errors.mjs'), /^refused: limit-mismatch$/m);
});
