// The public API: connect() and Client.

import type * as tls from 'node:tls';

import { type Ask, type GrantData, type KeyStatus, acquire, info, keepToken, query, release } from './calls.js';
import { BadArgumentError, ClosedError } from './errors.js';
import { Grant, HeldGrant } from './grant.js';
import { Pool, checkServers } from './pool.js';
import { Watch, firstState } from './watch.js';
import { type Request, type WatchState, checkKey, checkLimit, checkMs, checkSecret, checkToken, checkValue, normaliseAddress } from './wire.js';

/** Default time to establish a connection (TCP, TLS and `U` each). */
export const DEFAULT_CONNECT_TIMEOUT_MS = 2000;
/** Default time a server has to answer a request that does not wait in line. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 5000;

/** TLS settings: the contents (not paths) of PEM files, as node:tls takes them. */
export interface TlsOptions {
  /** CA certificates to trust (default: the system's roots). */
  ca?: string | Buffer | (string | Buffer)[];
  /** A client certificate and its key, for servers that ask for one (mTLS). */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** Anything else node:tls.connect takes (servername, minVersion, ...). */
  extra?: tls.ConnectionOptions;
}

export interface ConnectOptions {
  /** The shared secret of servers run with --auth-file (16 to 128 printable ASCII bytes, no spaces). */
  auth?: string;
  /** Speak TLS: `true` for the system roots, or settings. */
  tls?: boolean | TlsOptions;
  /** Default 2000. */
  connectTimeoutMs?: number;
  /** Default 5000. */
  requestTimeoutMs?: number;
  /** Where the client's log lines go (default: nowhere). */
  logger?: (message: string) => void;
}

export interface AcquireOptions {
  /** How long the grant lasts unless released or kept, in ms (above 0). */
  leaseMs: number;
  /** How long to wait in line, in ms: absent waits without limit, 0 takes
   * the key only if it can be granted now. */
  waitMs?: number;
  /** The key is a semaphore: up to `limit` grants hold it at once (1 to 10000). */
  limit?: number;
  /** Who holds it (an address, a host name): watchers see it. */
  value?: string;
  /** Abort the wait: the call rejects with the signal's reason, and a grant
   * that arrives after it is released at once. */
  signal?: AbortSignal;
}

export interface CampaignOptions {
  leaseMs: number;
  waitMs?: number;
  signal?: AbortSignal;
}

export interface CallOptions {
  signal?: AbortSignal;
}

function checkAcquire(key: unknown, options: AcquireOptions | undefined): { key: string; leaseMs: number; waitMs: number | null; ask: Ask } {
  if (options === null || typeof options !== 'object') throw new BadArgumentError('options with leaseMs are required');
  const k = checkKey(key);
  const leaseMs = checkMs(options.leaseMs, 'lease', false);
  // A wait of 0 is a try: the shortest wait the wire can say.
  const waitMs = options.waitMs === undefined || options.waitMs === null ? null : Math.max(1, checkMs(options.waitMs, 'wait', true));
  const ask: Ask = {};
  if (options.limit !== undefined) ask.limit = checkLimit(options.limit);
  if (options.value !== undefined) {
    ask.value = checkValue(options.value);
    // The value is the field after the limit: a value alone names limit 1.
    ask.limit ??= 1;
  }
  return { key: k, leaseMs, waitMs, ask };
}

/** A client of a baton service: one or more nodes, each reached through
 * persistent connections kept up in the background (two when one address
 * is given). Requests are pipelined on them; calls follow the active node
 * through failovers. Close it with `close()` (or `await using`). */
export class Client {
  /** @internal */ readonly pool: Pool;
  /** @internal */ readonly held = new Set<HeldGrant>();
  /** @internal */ readonly watches = new Set<Watch>();
  private closing: Promise<void> | null = null;

  /** @internal use connect() */
  constructor(servers: string[], settings: { connectTimeoutMs: number; requestTimeoutMs: number; auth: string | null; tls: tls.ConnectionOptions | null }, log: (m: string) => void) {
    this.pool = new Pool(servers, settings, log);
  }

  get closed(): boolean {
    return this.closing !== null;
  }

  /** The servers this client knows (those given, and those learned from redirects). */
  get servers(): string[] {
    return this.pool.servers();
  }

  /** Each connection: its server, whether it is up, its last error. */
  connections(): { server: string; connected: boolean; lastError: string | null }[] {
    return this.pool.statuses();
  }

  private live(): void {
    if (this.closing !== null) throw new ClosedError();
  }

  /** Acquire a key: a Grant, or TimeoutError (not granted within the
   * wait: nothing is held), RefusedError, UnavailableError. */
  async acquire(key: string, options: AcquireOptions): Promise<Grant> {
    this.live();
    const a = checkAcquire(key, options);
    const data = await acquire(this.pool, a.key, a.leaseMs, a.waitMs, a.ask, options.signal);
    return this.handOver(data, () => new Grant(this, data));
  }

  /** Acquire a key and keep it alive in the background until released:
   * the grant's `lost`, `signal` and 'lost' event say at once if it is lost. */
  async hold(key: string, options: AcquireOptions): Promise<HeldGrant> {
    this.live();
    const a = checkAcquire(key, options);
    const data = await acquire(this.pool, a.key, a.leaseMs, a.waitMs, a.ask, options.signal);
    return this.handOver(data, () => new HeldGrant(this, data));
  }

  /** A grant still in hand (counted by the pool) goes to its caller as
   * `make` builds it; if close began meanwhile, it is released instead
   * (close waits for that) and the call fails with ClosedError. */
  private async handOver<T>(data: GrantData, make: () => T): Promise<T> {
    try {
      if (this.closing !== null) {
        await this.pool.releaseClosing(data);
        throw new ClosedError();
      }
      return make();
    } finally {
      this.pool.handOut();
    }
  }

  /** Run `work` while holding the key (kept alive in the background), then
   * release it. `work` gets the grant: pass `grant.signal` to what it does
   * so that it stops if the key is lost. */
  async withLock<T>(key: string, options: AcquireOptions, work: (grant: HeldGrant) => Promise<T> | T): Promise<T> {
    const grant = await this.hold(key, options);
    try {
      return await work(grant);
    } finally {
      await grant[Symbol.asyncDispose]();
    }
  }

  /** Stand for leader of `key` (a key of limit 1 held with `value`, kept
   * alive in the background): resolves once this candidate leads. */
  async campaign(key: string, value: string, options: CampaignOptions): Promise<HeldGrant> {
    return this.hold(key, { ...options, limit: 1, value });
  }

  /** Release a grant known by its key and token: true when released,
   * false when that token did not hold the key. */
  async release(key: string, token: bigint): Promise<boolean> {
    this.live();
    const k = checkKey(key);
    const t = checkToken(token);
    return (await release(this.pool, k, t)) === 'released';
  }

  /** Extend a grant known by its key and token. LostError when the token
   * no longer holds the key. */
  async keep(key: string, token: bigint, leaseMs: number, options: CallOptions = {}): Promise<void> {
    this.live();
    await keepToken(this.pool, checkKey(key), checkToken(token), checkMs(leaseMs, 'lease', false), options.signal);
  }

  /** Who holds a key: the newest grant's token (0n when free), its lease
   * left in ms, and how many wait. */
  async query(key: string, options: CallOptions = {}): Promise<KeyStatus> {
    this.live();
    return query(this.pool, checkKey(key), options.signal);
  }

  /** Watch a key's holders: an async iterator of states (the first is the
   * state now), surviving failover; `break` or the signal ends it. */
  watch(key: string, options: CallOptions = {}): Watch {
    this.live();
    return new Watch(this, checkKey(key), false, options.signal);
  }

  /** Each change of leader of an election key (states whose token differs
   * from the last one yielded). */
  observe(key: string, options: CallOptions = {}): Watch {
    this.live();
    return new Watch(this, checkKey(key), true, options.signal);
  }

  /** The leader of an election key now (token 0n when nobody leads). */
  async leader(key: string, options: CallOptions = {}): Promise<WatchState> {
    this.live();
    const watch = new Watch(this, checkKey(key), false, options.signal);
    return firstState(watch, this.pool.connectTimeoutMs + this.pool.requestTimeoutMs, options.signal);
  }

  /** Ask one server about itself (`I`): its role, the active node, ... */
  async info(server: string, options: CallOptions = {}): Promise<Record<string, string>> {
    this.live();
    const addr = normaliseAddress(server);
    const node = this.pool.find(addr) ?? this.pool.nodeFor(addr);
    return info(this.pool, node, options.signal);
  }

  /** Close the client: watches end, held grants stop being kept and are
   * released (once, best effort), a grant that comes to a call close ended
   * (the key a held grant's release hands to this client's own waiter,
   * say) is released before the connections close, as is a grant an
   * acquire had already been given but not yet returned (one it was
   * confirming with K: close waits for that call, at most the request
   * timeout, and the call fails ClosedError), every later call fails
   * ClosedError, and
   * once the promise resolves no socket or timer of it is left. */
  close(): Promise<void> {
    if (this.closing !== null) return this.closing;
    const farewell: Request[] = [];
    for (const grant of [...this.held]) {
      const r = grant.abandon();
      if (r !== null) farewell.push({ op: 'R', key: r.key, token: r.token });
    }
    for (const watch of [...this.watches]) watch.end(null);
    this.closing = this.pool.close(farewell);
    return this.closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** A client for these servers (`host:port`; a host alone gets port 7373).
 * Returns at once: connections are made in the background, and the first
 * call waits for one (bounded by its deadline). Throws BadArgumentError on
 * a malformed address, secret or timeout. */
export function connect(addresses: string | readonly string[], options: ConnectOptions = {}): Client {
  const list = typeof addresses === 'string' ? [addresses] : [...addresses];
  checkServers(list);
  const servers: string[] = [];
  for (const a of list) {
    const addr = normaliseAddress(a);
    if (!servers.includes(addr)) servers.push(addr);
  }
  if (servers.length === 0) throw new BadArgumentError('no server address given');
  const auth = options.auth === undefined ? null : checkSecret(options.auth);
  const connectTimeoutMs = checkMs(options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS, 'connect timeout', false);
  const requestTimeoutMs = checkMs(options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS, 'request timeout', false);
  let tlsOptions: tls.ConnectionOptions | null = null;
  if (options.tls === true) tlsOptions = {};
  else if (options.tls !== undefined && options.tls !== false) {
    const t = options.tls;
    tlsOptions = { ...t.extra };
    if (t.ca !== undefined) tlsOptions.ca = t.ca;
    if (t.cert !== undefined) tlsOptions.cert = t.cert;
    if (t.key !== undefined) tlsOptions.key = t.key;
  }
  const log = options.logger ?? (() => {});
  return new Client(servers, { connectTimeoutMs, requestTimeoutMs, auth, tls: tlsOptions }, log);
}
