// The conformance driver: JSON lines on stdin, JSON lines on stdout (the
// repository's SPEC section 10), a thin adapter over the public API. Each
// request runs on its own (a waiting acquire never delays a later answer)
// and is answered exactly once with its id; events carry no id. Logs go to
// stderr (BATON_DRIVER_LOG=1).

import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

import { BatonError, type Client, type Grant, HeldGrant, type TlsOptions, VERSION, type Watch, type WatchState, connect } from './index.js';

type Json = Record<string, unknown>;

class BadRequest extends Error {}

const clients = new Map<string, Client>();
const grants = new Map<string, Grant>();
const watches = new Map<string, { watch: Watch; stopped: boolean }>();
let nextId = 1;
const logging = process.env['BATON_DRIVER_LOG'] === '1';
const logger = logging ? (m: string) => process.stderr.write(`driver: ${m}\n`) : undefined;

function emit(obj: Json): void {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function str(req: Json, name: string): string {
  const v = req[name];
  if (typeof v !== 'string') throw new BadRequest(`${name}: a string is required`);
  return v;
}

function int(req: Json, name: string): number {
  const v = req[name];
  if (typeof v !== 'number' || !Number.isInteger(v)) throw new BadRequest(`${name}: an integer is required`);
  return v;
}

function optInt(req: Json, name: string): number | undefined {
  return req[name] === undefined || req[name] === null ? undefined : int(req, name);
}

function optStr(req: Json, name: string): string | undefined {
  return req[name] === undefined || req[name] === null ? undefined : str(req, name);
}

function client(req: Json): Client {
  const c = clients.get(str(req, 'client'));
  if (c === undefined) throw new BadRequest(`unknown client ${String(req['client'])}`);
  return c;
}

function grant(req: Json): Grant {
  const g = grants.get(str(req, 'grant'));
  if (g === undefined) throw new BadRequest(`unknown grant ${String(req['grant'])}`);
  return g;
}

function stateJson(s: WatchState): Json {
  return { token: s.token.toString(), holders: s.holders, waiting: s.waiting, value: s.value };
}

function granted(g: Grant): Json {
  const id = `g${nextId++}`;
  grants.set(id, g);
  if (g instanceof HeldGrant) g.once('lost', () => emit({ event: 'lost', grant: id }));
  return { grant: id, token: g.token.toString(), slot: g.slot };
}

/** `cancel_after_ms`: the caller gives up (aborts) after that long. */
function cancelSignal(req: Json): AbortSignal | undefined {
  const ms = optInt(req, 'cancel_after_ms');
  if (ms === undefined) return undefined;
  const controller = new AbortController();
  setTimeout(() => controller.abort(), ms);
  return controller.signal;
}

function acquireOptions(req: Json) {
  const o: { leaseMs: number; waitMs?: number; limit?: number; value?: string; signal?: AbortSignal } = { leaseMs: int(req, 'lease_ms') };
  const signal = cancelSignal(req);
  if (signal !== undefined) o.signal = signal;
  const waitMs = optInt(req, 'wait_ms');
  if (waitMs !== undefined) o.waitMs = waitMs;
  const limit = optInt(req, 'limit');
  if (limit !== undefined) o.limit = limit;
  const value = optStr(req, 'value');
  if (value !== undefined) o.value = value;
  return o;
}

async function handle(req: Json): Promise<Json> {
  switch (req['cmd']) {
    case 'connect': {
      const addrs = req['addrs'];
      if (!Array.isArray(addrs) || !addrs.every((a) => typeof a === 'string')) throw new BadRequest('addrs: a list of strings is required');
      const options: { auth?: string; tls?: TlsOptions; logger?: (m: string) => void } = {};
      const auth = optStr(req, 'auth');
      if (auth !== undefined) options.auth = auth;
      if (logger !== undefined) options.logger = logger;
      const t = req['tls'];
      if (t !== undefined && t !== null) {
        if (typeof t !== 'object') throw new BadRequest('tls: an object is required');
        const tj = t as Json;
        const tlsOptions: TlsOptions = {};
        const ca = optStr(tj, 'ca');
        const cert = optStr(tj, 'cert');
        const key = optStr(tj, 'key');
        try {
          if (ca !== undefined) tlsOptions.ca = readFileSync(ca);
          if (cert !== undefined) tlsOptions.cert = readFileSync(cert);
          if (key !== undefined) tlsOptions.key = readFileSync(key);
        } catch (e) {
          throw new BadRequest(`tls: ${(e as Error).message}`);
        }
        options.tls = tlsOptions;
      }
      const c = connect(addrs as string[], options);
      const id = `c${nextId++}`;
      clients.set(id, c);
      return { client: id };
    }
    case 'acquire': {
      const c = client(req);
      return granted(await c.acquire(str(req, 'key'), acquireOptions(req)));
    }
    case 'hold': {
      const c = client(req);
      return granted(await c.hold(str(req, 'key'), acquireOptions(req)));
    }
    case 'campaign': {
      const c = client(req);
      const o: { leaseMs: number; waitMs?: number; signal?: AbortSignal } = { leaseMs: int(req, 'lease_ms') };
      const signal = cancelSignal(req);
      if (signal !== undefined) o.signal = signal;
      const waitMs = optInt(req, 'wait_ms');
      if (waitMs !== undefined) o.waitMs = waitMs;
      return granted(await c.campaign(str(req, 'key'), str(req, 'value'), o));
    }
    case 'release':
      await grant(req).release();
      return {};
    case 'keep': {
      const g = grant(req);
      await g.keep(int(req, 'lease_ms'));
      return {};
    }
    case 'query': {
      const s = await client(req).query(str(req, 'key'));
      return { token: s.token.toString(), ms_left: s.msLeft, waiting: s.waiting };
    }
    case 'leader':
      return stateJson(await client(req).leader(str(req, 'key')));
    case 'watch': {
      const c = client(req);
      const watch = c.watch(str(req, 'key'));
      const id = `w${nextId++}`;
      const entry = { watch, stopped: false };
      watches.set(id, entry);
      // The answer goes out before any state of the watch.
      setImmediate(() => void pump(id, entry));
      return { watch: id };
    }
    case 'unwatch': {
      const id = str(req, 'watch');
      const entry = watches.get(id);
      if (entry === undefined) throw new BadRequest(`unknown watch ${id}`);
      entry.stopped = true;
      await entry.watch.return();
      return {};
    }
    case 'close':
      await client(req).close();
      return {};
    default:
      throw new BadRequest(`unknown cmd ${JSON.stringify(req['cmd'])}`);
  }
}

async function pump(id: string, entry: { watch: Watch; stopped: boolean }): Promise<void> {
  try {
    for await (const state of entry.watch) {
      if (entry.stopped) break;
      emit({ event: 'state', watch: id, ...stateJson(state) });
    }
  } catch (e) {
    logger?.(`watch ${id} ended: ${(e as Error).message}`);
  }
}

function errorJson(e: unknown): Json {
  if (e instanceof BadRequest) return { kind: 'bad-argument', detail: e.message };
  if (e instanceof Error && e.name === 'AbortError') return { kind: 'timeout', detail: 'cancelled by the caller' };
  if (e instanceof BatonError) {
    const detail = e.code === 'refused' && 'reason' in e ? String((e as { reason: unknown }).reason) : e.message;
    return { kind: e.code, detail };
  }
  return { kind: 'unavailable', detail: e instanceof Error ? e.message : String(e) };
}

let exiting = false;

async function exit(): Promise<void> {
  if (exiting) return;
  exiting = true;
  const closing = Promise.all([...clients.values()].map((c) => c.close().catch(() => {})));
  const limit = new Promise((resolve) => setTimeout(resolve, 1500).unref());
  await Promise.race([closing, limit]);
  process.exit(0);
}

function onLine(line: string): void {
  if (line.trim() === '') return;
  let req: Json;
  try {
    const parsed: unknown = JSON.parse(line);
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('not an object');
    req = parsed as Json;
  } catch (e) {
    emit({ id: null, error: { kind: 'bad-argument', detail: `not a JSON object: ${(e as Error).message}` } });
    return;
  }
  const id = req['id'];
  if (req['cmd'] === 'exit') {
    emit({ id, ok: {} });
    void exit();
    return;
  }
  if (typeof id !== 'number' || !Number.isInteger(id)) {
    emit({ id: id ?? null, error: { kind: 'bad-argument', detail: 'id: an integer is required' } });
    return;
  }
  handle(req).then(
    (ok) => emit({ id, ok }),
    (e: unknown) => emit({ id, error: errorJson(e) }),
  );
}

emit({ ready: true, client: 'typescript', version: VERSION, cancel: true });
const input = createInterface({ input: process.stdin, crlfDelay: Infinity });
input.on('line', onLine);
input.on('close', () => void exit());
