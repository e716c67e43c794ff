// TLS and mutual TLS against a real batond, with a throwaway CA made by
// openssl (skipped when there is no openssl).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';

import { connect } from 'baton-locks';
import { Node, killAll, tmpDir } from './helpers.js';

after(() => killAll());

const hasOpenssl = spawnSync('openssl', ['version']).status === 0;

function openssl(dir: string, ...args: string[]): void {
  const r = spawnSync('openssl', args, { cwd: dir, encoding: 'utf8', timeout: 30_000 });
  if (r.status !== 0) throw new Error(`openssl ${args.join(' ')}: ${r.stderr}`);
}

/** A CA, a server certificate for 127.0.0.1 (IP SAN) and a client certificate. */
function pki(): { dir: string; ca: Buffer; clientCert: Buffer; clientKey: Buffer } {
  const dir = tmpDir();
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  openssl(dir, 'req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=test ca');
  writeFileSync(join(dir, 'server.ext'), 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
  writeFileSync(join(dir, 'client.ext'), 'extendedKeyUsage=clientAuth\n');
  for (const who of ['server', 'client']) {
    openssl(dir, 'req', ...ec, '-keyout', `${who}.key`, '-out', `${who}.csr`, '-subj', `/CN=${who}`);
    openssl(dir, 'x509', '-req', '-in', `${who}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out', `${who}.pem`, '-days', '2', '-extfile', `${who}.ext`);
  }
  return { dir, ca: readFileSync(join(dir, 'ca.pem')), clientCert: readFileSync(join(dir, 'client.pem')), clientKey: readFileSync(join(dir, 'client.key')) };
}

test('TLS: a trusted server works, an untrusted one is unavailable', { skip: !hasOpenssl && 'no openssl' }, async () => {
  const p = pki();
  const node = await Node.start(['--tls-cert', join(p.dir, 'server.pem'), '--tls-key', join(p.dir, 'server.key')]);
  try {
    await using client = connect(node.addr, { tls: { ca: p.ca } });
    const g = await client.acquire('tls', { leaseMs: 5000 });
    assert.equal((await client.query('tls')).token, g.token);
    await g.release();
    await using untrusting = connect(node.addr, { tls: true }); // the system roots do not know the test CA
    await assert.rejects(untrusting.query('tls'), { code: 'unavailable' });
    await using plain = connect(node.addr);
    await assert.rejects(plain.query('tls'), { code: 'unavailable' });
  } finally {
    node.kill();
  }
});

test('mutual TLS: a client certificate is presented; without one the server refuses', { skip: !hasOpenssl && 'no openssl' }, async () => {
  const p = pki();
  const node = await Node.start([
    '--tls-cert', join(p.dir, 'server.pem'),
    '--tls-key', join(p.dir, 'server.key'),
    '--tls-client-ca', join(p.dir, 'ca.pem'),
  ]);
  try {
    await using client = connect(node.addr, { tls: { ca: p.ca, cert: p.clientCert, key: p.clientKey } });
    assert.equal((await client.query('mtls')).token, 0n);
    await using anonymous = connect(node.addr, { tls: { ca: p.ca } });
    await assert.rejects(anonymous.query('mtls'), { code: 'unavailable' });
  } finally {
    node.kill();
  }
});
