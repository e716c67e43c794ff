// The servers and connections a client keeps, and the choice of a
// connection for each request.
//
// One connection per address given, two when only one address is given,
// one for a node first learned from an `M` redirect (at most MAX_SERVERS).
// Choice (`choose`, pure): the preferred node's connections first (the
// active one, after a redirect), if one is up or coming up; else any
// connection that is up, round-robin. An acquire of key K goes to a
// connection with no acquire of K outstanding, when one of those is up: the
// server answers a later acquire of K on a connection (even its T) only
// after the earlier one, so a try-acquire sent behind the same client's
// acquire of K waiting in line would wait for that one. When every such
// connection that is up has one and another is still connecting (a new
// client's second), the acquire waits for a connection to change (`pick`,
// bounded as below), then takes a free one if one came up, else a busy one
// after all. When every such connection has one and none is connecting it
// is sent anyway, and its overdue clock starts only when the earlier one is
// answered (calls.ts). A caller waits only while some
// connection it could use is connecting, bounded by its own deadline and
// the connect timeout (+1 s), and fails at once when every one is down.

import { Conn, type ConnOwner, type ConnSettings, type Phase } from './conn.js';
import { BadArgumentError, ClosedError, RefusedError, UnavailableError } from './errors.js';
import type { Request } from './wire.js';

export const CONNECTIONS_FOR_ONE_SERVER = 2;
export const MAX_SERVERS = 64;
const CONNECT_SLACK_MS = 1000;

/** Any node, or one node by its index. */
export type Target = number | 'any';

export type Choice = { use: number } | 'wait' | 'nothing';

/** Which connection a request takes: `conns` are (node, phase, busy)
 * triples, busy when an acquire of the same key is outstanding there (those
 * not busy come first; when every one up is busy and another is
 * connecting, 'wait': it will be free, rather that than queue behind this
 * client's own waiter). */
export function choose(conns: readonly (readonly [number, Phase, boolean?])[], target: Target, preferred: number | null, turn: number): Choice {
  const among = (node: number | null): Choice => {
    const fits = (n: number) => node === null || node === n;
    const up: number[] = [];
    const free: number[] = [];
    for (let i = 0; i < conns.length; i++) {
      const [n, phase, busy] = conns[i]!;
      if (fits(n) && phase === 'up') {
        up.push(i);
        if (busy !== true) free.push(i);
      }
    }
    if (free.length > 0) return { use: free[turn % free.length]! };
    if (conns.some(([n, phase]) => fits(n) && phase === 'connecting')) return 'wait';
    if (up.length > 0) return { use: up[turn % up.length]! };
    return 'nothing';
  };
  if (target !== 'any') return among(target);
  if (preferred !== null) {
    const choice = among(preferred);
    if (choice !== 'nothing') return choice;
  }
  return among(null);
}

interface Node {
  addr: string;
  conns: Conn[];
}

export class Pool implements ConnOwner {
  closed = false;
  private readonly nodes: Node[] = [];
  private all: Conn[] = [];
  private preferred: number | null = null;
  private turn = 0;
  private readonly waiters = new Set<() => void>();
  /** Grants in hand: delivered to an acquire call that has not returned
   * it yet (confirming it with K, say). close() waits until none is left
   * before it settles and closes the connections. */
  private hands = 0;
  private readonly handsFreeWaiters = new Set<() => void>();

  constructor(
    servers: readonly string[],
    readonly settings: ConnSettings,
    readonly log: (message: string) => void,
  ) {
    const perNode = servers.length === 1 ? CONNECTIONS_FOR_ONE_SERVER : 1;
    for (const addr of servers) this.addNode(addr, perNode);
  }

  get requestTimeoutMs(): number {
    return this.settings.requestTimeoutMs;
  }

  get connectTimeoutMs(): number {
    return this.settings.connectTimeoutMs;
  }

  private addNode(addr: string, count: number): number {
    const index = this.nodes.length;
    const conns: Conn[] = [];
    for (let i = 0; i < count; i++) conns.push(new Conn(index, addr, this));
    this.nodes.push({ addr, conns });
    this.all = this.nodes.flatMap((n) => n.conns);
    for (const c of conns) c.start();
    this.bump();
    return index;
  }

  /** Wake every caller waiting for a connection to change phase. */
  bump(): void {
    if (this.waiters.size === 0) return;
    const waiters = [...this.waiters];
    this.waiters.clear();
    for (const w of waiters) w();
  }

  /** Call `listener` once at the next phase change; returns a canceller. */
  onceChanged(listener: () => void): () => void {
    this.waiters.add(listener);
    return () => this.waiters.delete(listener);
  }

  /** The node with this address, registered (one connection) if new. */
  nodeFor(addr: string): number {
    const found = this.nodes.findIndex((n) => n.addr === addr);
    if (found >= 0) return found;
    if (this.nodes.length >= MAX_SERVERS) {
      throw new UnavailableError(`redirected to ${addr}, but this client already knows ${MAX_SERVERS} servers`);
    }
    this.log(`learned of server ${addr} from a redirect`);
    return this.addNode(addr, 1);
  }

  find(addr: string): number | null {
    const found = this.nodes.findIndex((n) => n.addr === addr);
    return found >= 0 ? found : null;
  }

  prefer(node: number): void {
    this.preferred = node;
  }

  /** Some connection of the node is up or coming up. */
  isReachable(node: number): boolean {
    return this.nodes[node]?.conns.some((c) => c.phase !== 'down') ?? false;
  }

  connectionCount(target: Target): number {
    if (target === 'any') return this.all.length;
    return this.nodes[target]?.conns.length ?? 0;
  }

  /** A connection that is up now (for an acquire of `acquireKey`, one with
   * no acquire of it outstanding if it can); null while one could come up
   * soon; throws when none can (every one is down, or the client is
   * closed). */
  tryPick(target: Target, acquireKey?: string): Conn | null {
    if (this.closed) throw new ClosedError();
    const conns = this.all;
    const phases = conns.map((c) => [c.node, c.phase, acquireKey !== undefined && c.hasPending('A', acquireKey)] as const);
    const choice = choose(phases, target, this.preferred, this.turn++);
    if (this.turn > 0x3fffffff) this.turn = 0;
    if (choice === 'wait') return null;
    if (choice === 'nothing') throw this.noConnection(target, '');
    return conns[choice.use]!;
  }

  /** A connection that is up, waiting for one that is connecting until
   * `due` (ms, performance.now) or the connect timeout; an acquire waited
   * on for a free one (every one up busy with its key) takes a busy one
   * when the wait ends. */
  async pick(target: Target, due: number | null, signal?: AbortSignal, acquireKey?: string): Promise<Conn> {
    const patience = performance.now() + this.connectTimeoutMs + CONNECT_SLACK_MS;
    const until = due === null ? patience : Math.min(due, patience);
    for (;;) {
      const conn = this.tryPick(target, acquireKey);
      if (conn !== null) return conn;
      const changed = await this.waitChange(until, signal);
      if (!changed) {
        if (this.closed) throw new ClosedError();
        // Up but busy with this key, if one is: it serves after all.
        const busy = acquireKey === undefined ? null : this.tryPick(target);
        if (busy !== null) return busy;
        throw this.noConnection(target, 'still connecting: ');
      }
    }
  }

  /** True at the next phase change, false at `until`. */
  waitChange(until: number, signal?: AbortSignal): Promise<boolean> {
    return new Promise<boolean>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const done = (value: boolean) => {
        clearTimeout(timer);
        cancel();
        signal?.removeEventListener('abort', onAbort);
        resolve(value);
      };
      const onAbort = () => {
        clearTimeout(timer);
        cancel();
        reject(signal!.reason);
      };
      const cancel = this.onceChanged(() => done(true));
      const timer = setTimeout(() => done(false), Math.max(0, until - performance.now()));
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** The error for "no connection could carry it": the server's refusal
   * when it refused this client's secret. */
  noConnection(target: Target, prefix: string): Error {
    if (this.closed) return new ClosedError();
    const refused = this.authRefused(target);
    if (refused !== null) return new RefusedError(refused, `the server refused the secret: ${refused} (${this.describe(target)})`);
    return new UnavailableError(`no connection: ${prefix}${this.describe(target)}`);
  }

  authRefused(target: Target): string | null {
    for (const c of this.all) {
      if ((target === 'any' || target === c.node) && c.authRefused !== null) return c.authRefused;
    }
    return null;
  }

  describe(target: Target): string {
    const parts: string[] = [];
    this.nodes.forEach((node, index) => {
      if (target !== 'any' && target !== index) return;
      const why = node.conns.find((c) => c.lastError !== null)?.lastError ?? 'not connected yet';
      parts.push(`${node.addr} (${why})`);
    });
    return parts.join('; ');
  }

  servers(): string[] {
    return this.nodes.map((n) => n.addr);
  }

  statuses(): { server: string; connected: boolean; lastError: string | null }[] {
    return this.all.map((c) => ({ server: c.addr, connected: c.isUp, lastError: c.lastError }));
  }

  takeInHand(): void {
    this.hands++;
  }

  /** A grant in hand was returned to its caller or released. */
  handOut(): void {
    if (--this.hands > 0) return;
    const waiters = [...this.handsFreeWaiters];
    this.handsFreeWaiters.clear();
    for (const w of waiters) w();
  }

  /** Resolves once no grant is in hand, or at `untilMs`. */
  private handsFree(untilMs: number): Promise<void> {
    if (this.hands === 0) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.handsFreeWaiters.delete(done);
        resolve();
      };
      const timer = setTimeout(() => {
        this.log(`closing: ${this.hands} grant(s) in hand still unreleased`);
        done();
      }, Math.max(0, untilMs - performance.now()));
      this.handsFreeWaiters.add(done);
    });
  }

  /** Release a grant in hand that nobody will get because the client is
   * closing: R on a connection that is up (close keeps them open until no
   * grant is in hand), awaited for up to the request timeout. */
  async releaseClosing(grant: { key: string; token: bigint }): Promise<void> {
    const conn = this.all.find((c) => c.isUp) ?? null;
    const answer = conn === null ? null : await conn.ask({ op: 'R', key: grant.key, token: grant.token }, performance.now() + this.requestTimeoutMs);
    if (answer === null) this.log(`closing: could not release ${grant.key} (token ${grant.token}); its lease will run out`);
  }

  /** Close every connection; `farewell` (releases) is sent once on a
   * connection that is up and answered (bounded by the request timeout),
   * and a grant that comes to a call close ended is released before the
   * sockets close, as is a grant in hand (its call releases it; close
   * waits for that). Resolves when every socket is closed. */
  async close(farewell: Request[]): Promise<void> {
    if (this.closed) return;
    let carrier: Conn | null = null;
    try {
      carrier = this.tryPick('any');
    } catch {
      carrier = null;
    }
    this.closed = true;
    this.bump();
    // Every call under way ends, and a grant that still comes to one goes
    // to nobody: released at once. The held grants' releases are sent and
    // answered, then each connection takes in the grants already made to
    // it (the key a release hands to this client's own waiter, say) and
    // their releases reach the server, before the sockets close. A call
    // with a grant in hand sees the client closed and releases the grant
    // itself, meanwhile.
    for (const c of this.all) c.abandonAll();
    const until = performance.now() + this.requestTimeoutMs;
    const sent = carrier;
    await Promise.all([...(sent === null ? [] : farewell.map((r) => sent.ask(r, until))), this.handsFree(until)]);
    await Promise.all(this.all.map((c) => c.settleForClose(until)));
    await Promise.all(this.all.map((c) => c.close([], this.connectTimeoutMs)));
  }
}

export function checkServers(servers: readonly string[]): void {
  if (servers.length > MAX_SERVERS) {
    throw new BadArgumentError(`${servers.length} servers given; at most ${MAX_SERVERS} are supported`);
  }
}
