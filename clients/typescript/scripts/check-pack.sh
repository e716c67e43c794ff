#!/usr/bin/env bash
# The packed package installs into a fresh project and works there: ESM
# import, CommonJS require, and its type declarations under tsc --strict.
# Run from clients/typescript after `npm run build`. Needs no network (the
# package has no dependencies; tsc and @types/node, which a TypeScript
# project using it has too, come from this package's devDependencies).
set -euo pipefail
here=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tarball=$(npm pack --silent --pack-destination "$work" | tail -n 1)
echo "packed $tarball: $(tar tzf "$work/$tarball" | tr '\n' ' ')"
if tar tzf "$work/$tarball" | grep -q 'driver'; then
  echo "the driver must not be in the package" >&2
  exit 1
fi

mkdir "$work/app"
cd "$work/app"
cat > package.json <<'JSON'
{ "name": "fresh-app", "version": "1.0.0", "private": true, "type": "module" }
JSON
npm install --no-audit --no-fund --offline --silent "$work/$tarball"

cat > esm.mjs <<'JS'
import { connect, TimeoutError, LostError, RefusedError, UnavailableError, ClosedError, BadArgumentError, VERSION } from 'baton-locks';
const client = connect('127.0.0.1:1');
try {
  await client.acquire('bad key', { leaseMs: 1000 });
} catch (e) {
  if (!(e instanceof BadArgumentError) || e.code !== 'bad-argument') throw e;
}
await client.close();
for (const E of [TimeoutError, LostError, RefusedError, UnavailableError, ClosedError]) if (typeof E !== 'function') throw new Error('missing export');
console.log('esm ok', VERSION);
JS
node esm.mjs

cat > cjs.cjs <<'JS'
const { connect, ClosedError } = require('baton-locks');
const client = connect(['127.0.0.1:1']);
client.close().then(async () => {
  try { await client.query('k'); } catch (e) { if (!(e instanceof ClosedError)) throw e; }
  console.log('cjs ok');
});
JS
node cjs.cjs

cat > typed.ts <<'TS'
import { connect, type Grant, type HeldGrant, type WatchState, LostError } from 'baton-locks';
async function job(): Promise<bigint> {
  await using client = connect(['10.0.0.1:7373', '10.0.0.2:7373'], { requestTimeoutMs: 3000 });
  const grant: Grant = await client.acquire('invoices', { leaseMs: 30_000, waitMs: 10_000 });
  const held: HeldGrant = await client.hold('reindex', { leaseMs: 10_000, limit: 4, value: 'host-a' });
  const why: LostError = await held.lost;
  const state: WatchState = await client.leader('election');
  const token: bigint = grant.token + state.token;
  void why;
  return token;
}
void job;
TS
cat > typed-cjs.cts <<'TS'
import baton = require('baton-locks');
async function job(): Promise<bigint> {
  const client = baton.connect('127.0.0.1:7373');
  const grant: baton.Grant = await client.acquire('invoices', { leaseMs: 30_000 });
  await client.close();
  return grant.token;
}
void job;
TS
cat > tsconfig.json <<'JSON'
{ "compilerOptions": { "strict": true, "noEmit": true, "target": "ES2022", "lib": ["ES2022", "ESNext.Disposable"],
  "module": "NodeNext", "moduleResolution": "NodeNext", "types": ["node"], "typeRoots": ["__HERE__/node_modules/@types"] },
  "files": ["typed.ts", "typed-cjs.cts"] }
JSON
sed -i "s#__HERE__#$here#" tsconfig.json
"$here/node_modules/.bin/tsc" -p tsconfig.json
echo "types ok"
