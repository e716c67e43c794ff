// One persistent connection to one server, kept up in the background.
//
// Owns the socket of one registered connection, its phase (connecting, up,
// down), the requests sent on it that wait for their answer (a Pending
// table matched by (op, key) in send order), its watch subscriptions, and
// its timers: the connect / TLS / auth timeout, the liveness probe, and the
// 3 s reconnect after a failed attempt or a drop.
//
// Held-back answers: the server answers one (op, key) on a connection in
// request order, so a request sent behind an earlier one of its (op, key)
// (an acquire behind an acquire of the same key waiting in line) cannot be
// answered before it, even when its own wait has run out: its slot's
// `frontAt` is set when it reaches the front of that line, and the call's
// overdue clock (calls.ts) runs only from then.
//
// Liveness: when the connection has requests waiting or watches and the
// server has said nothing for the request timeout, an `I` probe goes out;
// no answer within another request timeout closes the connection.
//
// Handles: the socket keeps the process alive only while requests wait on
// it or keys are watched on it; every timer here is unref'd. close() leaves
// nothing behind.
//
// Never does: retry, redirect or decide anything about a call (calls.ts).

import * as net from 'node:net';
import * as tls from 'node:tls';

import { Pending } from './pending.js';
import { type Answer, type Request, type WatchState, MAX_LINE, answerRoute, encode, parseAnswer, requestKey, splitAddress } from './wire.js';

export const RECONNECT_INTERVAL_MS = 3000;
export const MAX_IN_FLIGHT = 65_536;

export type Phase = 'connecting' | 'up' | 'down';

/** Where a request's answer goes. `settle(null)`: the connection ended
 * before an answer came. An abandoned slot (its caller gave up) gets
 * nothing; a grant for it is released at once. */
export interface Slot {
  abandoned: boolean;
  /** When the request reached the front of its (op, key) line here
   * (performance.now); null while it waits behind an earlier one. */
  frontAt: number | null;
  /** When the request is sent (performance.now): one sent at the front of
   * its line can be answered from then on. */
  readonly sentAt: number;
  settle(answer: Answer | null): void;
}

/** What a connection tells a watch subscription. */
export type WatchEvent =
  | { kind: 'state'; state: WatchState }
  | { kind: 'moved'; active: string | null }
  | { kind: 'refused'; reason: string }
  | { kind: 'ended' };

export interface Sub {
  onEvent(event: WatchEvent): void;
}

interface Watchers {
  /** Subscriptions whose `W` is not answered yet, in send order (null: given up). */
  awaiting: (Sub | null)[];
  live: Sub[];
}

export interface ConnSettings {
  connectTimeoutMs: number;
  requestTimeoutMs: number;
  auth: string | null;
  tls: tls.ConnectionOptions | null;
}

/** What a connection tells its pool. */
export interface ConnOwner {
  readonly settings: ConnSettings;
  readonly closed: boolean;
  /** A connection changed phase. */
  bump(): void;
  log(message: string): void;
  /** A grant is delivered to its acquire call: it is in hand until the
   * call returns it or releases it (close waits for that). */
  takeInHand(): void;
}

export class Conn {
  phase: Phase = 'connecting';
  /** Counts up each time the connection comes up. */
  generation = 0;
  lastError: string | null = null;
  /** The server refused this client's secret: its reason word. */
  authRefused: string | null = null;

  private socket: net.Socket | null = null;
  private ready = false;
  private readonly pending = new Pending<Slot | null>();
  private readonly watches = new Map<string, Watchers>();
  private out: string[] = [];
  private flushQueued = false;
  private input: Buffer | null = null;
  private referenced = false;
  private killReason: string | null = null;
  private lastHeard = 0;
  private probing = false;
  private silenceTimer: NodeJS.Timeout | null = null;
  private stageTimer: NodeJS.Timeout | null = null;
  private reconnectTimer: NodeJS.Timeout | null = null;
  private closedWaiters: (() => void)[] = [];

  constructor(
    readonly node: number,
    readonly addr: string,
    private readonly owner: ConnOwner,
  ) {}

  start(): void {
    this.open();
  }

  get isUp(): boolean {
    return this.phase === 'up';
  }

  /** Send a request; its answer goes to `slot` (null: ignored). False when
   * the connection is not up or too many requests wait on it. */
  send(request: Request, slot: Slot | null): boolean {
    if (!this.ready || this.pending.size >= MAX_IN_FLIGHT) return false;
    this.write(encode(request));
    if (this.pending.push(request.op, requestKey(request), slot) && slot !== null) slot.frontAt = slot.sentAt;
    this.touch();
    return true;
  }

  /** A request with this (op, key) waits for its answer here (a later one
   * would be answered only after it). */
  hasPending(op: string, key: string): boolean {
    return this.pending.has(op, key);
  }

  /** Subscribe `sub` to a key's lines: its generation, or null when down. */
  watch(key: string, sub: Sub): number | null {
    if (!this.ready) return null;
    this.write(`W ${key}\n`);
    let watchers = this.watches.get(key);
    if (watchers === undefined) {
      watchers = { awaiting: [], live: [] };
      this.watches.set(key, watchers);
    }
    watchers.awaiting.push(sub);
    this.touch();
    return this.generation;
  }

  /** Give up a subscription; `X <key>` goes out once the key's last one on
   * this connection goes. */
  unwatch(key: string, generation: number, sub: Sub): void {
    if (generation !== this.generation || !this.ready) return;
    const watchers = this.watches.get(key);
    if (watchers === undefined) return;
    watchers.awaiting = watchers.awaiting.map((s) => (s === sub ? null : s));
    watchers.live = watchers.live.filter((s) => s !== sub);
    if (watchers.live.length > 0 || watchers.awaiting.some((s) => s !== null)) return;
    if (watchers.awaiting.length === 0) this.watches.delete(key);
    this.send({ op: 'X', key }, null);
    this.touch();
  }

  /** Close this connection (it reconnects) when it is still the one the
   * caller used. */
  kill(generation: number, why: string): void {
    if (generation !== this.generation || !this.ready || this.socket === null) return;
    this.owner.log(`${this.addr}: ${why}; closing the connection`);
    this.killReason = why;
    this.socket.destroy();
  }

  /** The client is closing: every caller waiting here is told its call
   * ended (as if the connection had), and its slot stays, abandoned, so
   * that a grant that still comes for it goes to nobody and is released
   * at once. */
  abandonAll(): void {
    for (const slot of this.pending.slots()) {
      if (slot !== null && !slot.abandoned) {
        slot.abandoned = true;
        slot.settle(null);
      }
    }
  }

  /** Send `request` and wait for its answer until `untilMs`
   * (performance.now); null when it could not be sent, the connection
   * ended or the time ran out. */
  ask(request: Request, untilMs: number): Promise<Answer | null> {
    return new Promise<Answer | null>((resolve) => {
      const timer = setTimeout(() => {
        slot.abandoned = true;
        resolve(null);
      }, Math.max(0, untilMs - performance.now()));
      timer.unref();
      const slot: Slot = {
        abandoned: false,
        frontAt: null,
        sentAt: performance.now(),
        settle(answer: Answer | null) {
          clearTimeout(timer);
          resolve(answer);
        },
      };
      if (!this.send(request, slot)) {
        clearTimeout(timer);
        resolve(null);
      }
    });
  }

  /** The client is closing (every waiting slot abandoned): make sure that
   * every grant the server made to this connection so far has come (and
   * been released: its slot is abandoned), and that those releases have
   * reached the server, before the socket closes. Two `I` round trips
   * when an acquire or a release is outstanding: the server writes a
   * connection's answers in the order of its rounds, so the first `I`'s
   * answer comes after every grant made before the `I` was read, and the
   * second's after the releases of those grants. Until `untilMs`. */
  async settleForClose(untilMs: number): Promise<void> {
    for (let i = 0; i < 2; i++) {
      if (!this.pending.hasOp('A') && !this.pending.hasOp('R')) return;
      if ((await this.ask({ op: 'I' }, untilMs)) === null) return;
    }
  }

  /** Stop for good: answers nothing more, reconnects never. `farewell`
   * lines (releases) are written first when the connection is up, and the
   * socket is then ended gracefully (destroyed after `graceMs`). Resolves
   * once the socket is closed. */
  close(farewell: Request[], graceMs: number): Promise<void> {
    this.clearTimer('reconnectTimer');
    this.clearTimer('stageTimer');
    this.clearTimer('silenceTimer');
    for (const slot of this.pending.drain()) {
      if (slot !== null && !slot.abandoned) slot.settle(null);
    }
    this.endWatches();
    const socket = this.socket;
    if (socket === null) {
      this.phase = 'down';
      return Promise.resolve();
    }
    const closed = new Promise<void>((resolve) => this.closedWaiters.push(resolve));
    if (this.ready) {
      for (const r of farewell) this.write(encode(r));
      this.flush();
      this.ready = false;
      socket.ref();
      socket.end();
      const force = setTimeout(() => socket.destroy(), graceMs);
      force.unref();
      socket.once('close', () => clearTimeout(force));
    } else {
      socket.destroy();
    }
    return closed;
  }

  // --- the socket ---------------------------------------------------------------

  private open(): void {
    if (this.owner.closed) return;
    this.setPhase('connecting', null);
    const { settings } = this.owner;
    const { host, port } = splitAddress(this.addr);
    let socket: net.Socket;
    const useTls = settings.tls !== null;
    try {
      if (useTls) {
        const servername = net.isIP(host) === 0 ? host : undefined;
        socket = tls.connect({ ...settings.tls, host, port, servername });
      } else {
        socket = net.connect({ host, port });
      }
    } catch (e) {
      this.failed(`cannot connect: ${(e as Error).message}`);
      return;
    }
    this.socket = socket;
    this.referenced = true;
    this.setReferenced(false);
    socket.setNoDelay(true);
    this.stage(settings.connectTimeoutMs, 'no connection within the connect timeout');
    let why: string | null = null;
    socket.on('error', (e: NodeJS.ErrnoException) => {
      why ??= plain(e);
    });
    socket.on('close', () => {
      this.socket = null;
      this.clearTimer('stageTimer');
      if (this.ready || this.phase === 'up') this.goDown(why ?? 'closed by the server');
      else this.failed(why ?? 'closed by the server');
      const waiters = this.closedWaiters;
      this.closedWaiters = [];
      for (const w of waiters) w();
    });
    socket.on(useTls ? 'secureConnect' : 'connect', () => {
      if (settings.auth !== null) {
        // `U` first, inside TLS; the connection is up once it is accepted.
        this.stage(settings.connectTimeoutMs, 'no answer to U within the connect timeout');
        socket.write(encode({ op: 'U', secret: settings.auth }));
      } else {
        this.up();
      }
    });
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
  }

  private stage(ms: number, why: string): void {
    this.clearTimer('stageTimer');
    const t = setTimeout(() => {
      this.stageTimer = null;
      this.killReason = why;
      this.socket?.destroy();
    }, ms);
    t.unref();
    this.stageTimer = t;
  }

  private up(): void {
    this.clearTimer('stageTimer');
    this.generation++;
    this.ready = true;
    this.killReason = null;
    this.authRefused = null;
    this.lastError = null;
    this.lastHeard = performance.now();
    this.probing = false;
    this.setPhase('up', null);
  }

  /** A connection attempt that never came up. */
  private failed(why: string): void {
    this.setPhase('down', this.killReason ?? why);
    this.killReason = null;
    this.scheduleReconnect();
  }

  private goDown(why: string): void {
    this.ready = false;
    this.clearTimer('silenceTimer');
    this.out = [];
    const reason = this.killReason ?? why;
    this.killReason = null;
    this.owner.log(`${this.addr}: connection lost: ${reason}`);
    this.lastError = reason;
    this.phase = 'down';
    const slots = this.pending.drain();
    this.endWatches();
    this.input = null;
    this.owner.bump();
    for (const slot of slots) {
      if (slot !== null && !slot.abandoned) slot.settle(null);
    }
    this.scheduleReconnect();
  }

  private endWatches(): void {
    const subs: Sub[] = [];
    for (const w of this.watches.values()) {
      for (const s of w.awaiting) if (s !== null) subs.push(s);
      subs.push(...w.live);
    }
    this.watches.clear();
    for (const s of subs) s.onEvent({ kind: 'ended' });
  }

  private scheduleReconnect(): void {
    if (this.owner.closed) return;
    this.clearTimer('reconnectTimer');
    const t = setTimeout(() => {
      this.reconnectTimer = null;
      this.open();
    }, RECONNECT_INTERVAL_MS);
    t.unref();
    this.reconnectTimer = t;
  }

  private setPhase(phase: Phase, error: string | null): void {
    this.phase = phase;
    if (error !== null) this.lastError = error;
    this.owner.bump();
  }

  private clearTimer(name: 'silenceTimer' | 'stageTimer' | 'reconnectTimer'): void {
    const t = this[name];
    if (t !== null) {
      clearTimeout(t);
      this[name] = null;
    }
  }

  // --- writing --------------------------------------------------------------------

  /** Lines written in one turn of the event loop go out in one write. */
  private write(line: string): void {
    this.out.push(line);
    if (!this.flushQueued) {
      this.flushQueued = true;
      process.nextTick(() => this.flush());
    }
  }

  private flush(): void {
    this.flushQueued = false;
    if (this.out.length === 0 || this.socket === null) return;
    const data = this.out.length === 1 ? this.out[0]! : this.out.join('');
    this.out = [];
    this.socket.write(data);
  }

  /** Something waits on the connection: keep the process alive and watch
   * for silence. */
  private touch(): void {
    const busy = this.pending.size > 0 || this.watches.size > 0;
    this.setReferenced(busy);
    if (busy && this.silenceTimer === null && this.ready) this.armSilence(this.owner.settings.requestTimeoutMs);
  }

  private setReferenced(on: boolean): void {
    if (this.referenced === on || this.socket === null) return;
    this.referenced = on;
    if (on) this.socket.ref();
    else this.socket.unref();
  }

  private armSilence(ms: number): void {
    const t = setTimeout(() => this.onSilenceTimer(), ms);
    t.unref();
    this.silenceTimer = t;
  }

  private onSilenceTimer(): void {
    this.silenceTimer = null;
    if (!this.ready) return;
    const rt = this.owner.settings.requestTimeoutMs;
    const busy = this.pending.size > 0 || this.watches.size > 0;
    if (!busy) {
      this.probing = false;
      return;
    }
    const quiet = performance.now() - this.lastHeard;
    if (quiet < rt) {
      this.armSilence(rt - quiet);
      return;
    }
    if (this.probing) {
      this.kill(this.generation, `no answer to a probe within ${rt} ms`);
      return;
    }
    this.probing = true;
    this.lastHeard = performance.now();
    this.send({ op: 'I' }, null);
    if (this.silenceTimer === null) this.armSilence(rt);
  }

  // --- reading --------------------------------------------------------------------

  private onData(chunk: Buffer): void {
    if (this.socket === null) return;
    this.lastHeard = performance.now();
    this.probing = false;
    let data = this.input === null ? chunk : Buffer.concat([this.input, chunk]);
    const last = data.lastIndexOf(0x0a);
    if (last < 0) {
      if (data.length > MAX_LINE) return this.protocolError('the server sent a line that is too long');
      this.input = data;
      return;
    }
    const rest = data.subarray(last + 1);
    this.input = rest.length > 0 ? Buffer.from(rest) : null;
    if (rest.length > MAX_LINE) return this.protocolError('the server sent a line that is too long');
    const text = data.toString('utf8', 0, last);
    data = Buffer.alloc(0);
    let start = 0;
    while (start <= text.length) {
      let end = text.indexOf('\n', start);
      if (end < 0) end = text.length;
      let line = text.slice(start, end);
      start = end + 1;
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line === '') continue;
      const why = this.onLine(line);
      if (why !== null) return this.protocolError(why);
      if (this.socket === null) return;
    }
    this.touch();
  }

  private protocolError(why: string): void {
    this.killReason = why;
    this.socket?.destroy();
  }

  /** One line from the server; a reason to close the connection, or null. */
  private onLine(line: string): string | null {
    const answer = parseAnswer(line);
    if (answer === null) return `the server sent a line that does not parse: ${JSON.stringify(line.slice(0, 80))}`;
    if (!this.ready) return this.onAuthAnswer(answer);
    switch (answer.kind) {
      case 'W': {
        const watchers = this.watches.get(answer.key);
        if (watchers === undefined) return null; // unwatched, its X not answered yet
        const first = watchers.awaiting.shift();
        if (first !== undefined && first !== null) watchers.live.push(first);
        for (const sub of watchers.live) sub.onEvent({ kind: 'state', state: answer.state });
        if (watchers.awaiting.length === 0 && watchers.live.length === 0) this.watches.delete(answer.key);
        return null;
      }
      case 'M':
        if (answer.op === 'W' && answer.key !== null) {
          const watchers = this.watches.get(answer.key);
          this.watches.delete(answer.key);
          if (watchers !== undefined) {
            for (const sub of [...watchers.awaiting, ...watchers.live]) sub?.onEvent({ kind: 'moved', active: answer.active });
          }
          return null;
        }
        break;
      case 'E':
        if (answer.op === 'W' && answer.key !== null) {
          const watchers = this.watches.get(answer.key);
          if (watchers === undefined) return null;
          const first = watchers.awaiting.shift();
          if (first !== undefined && first !== null) first.onEvent({ kind: 'refused', reason: answer.reason });
          if (watchers.awaiting.length === 0 && watchers.live.length === 0) this.watches.delete(answer.key);
          return null;
        }
        break;
    }
    const route = answerRoute(answer);
    if (route === null) {
      const reason = answer.kind === 'E' ? answer.reason : 'unknown';
      if (reason === 'bad-auth' || reason === 'auth-required') {
        this.authRefused = reason;
        return `the server refused the secret: ${reason}`;
      }
      return `refused by the server: ${reason}`;
    }
    const taken = this.pending.take(route[0], route[1]);
    if (taken === undefined) return `the server sent an answer for no request: ${JSON.stringify(line.slice(0, 80))}`;
    const next = this.pending.front(route[0], route[1])?.slot;
    if (next != null && next.frontAt === null) next.frontAt = performance.now();
    const slot = taken.slot;
    if (slot === null) return null;
    if (slot.abandoned) {
      if (answer.kind === 'A') {
        // Its caller gave up: the grant is nobody's, release it at once.
        this.owner.log(`${this.addr}: releasing ${answer.key} (token ${answer.token}): its caller gave up`);
        this.send({ op: 'R', key: answer.key, token: answer.token }, null);
      }
      return null;
    }
    if (answer.kind === 'A') this.owner.takeInHand();
    slot.settle(answer);
    return null;
  }

  private onAuthAnswer(answer: Answer): string | null {
    if (answer.kind === 'U' || (answer.kind === 'E' && answer.op === 'U' && answer.reason === 'auth-disabled')) {
      this.up();
      return null;
    }
    if (answer.kind === 'E' && answer.op === null && (answer.reason === 'bad-auth' || answer.reason === 'auth-required')) {
      this.authRefused = answer.reason;
      return `the server refused the secret: ${answer.reason}`;
    }
    if (answer.kind === 'E' && answer.op === null) return `refused by the server: ${answer.reason}`;
    return "the server's answer to U makes no sense";
  }
}

function plain(e: NodeJS.ErrnoException): string {
  if (e.code === 'ECONNREFUSED') return 'connection refused';
  if (e.code === 'ECONNRESET') return 'connection reset';
  return e.message;
}
