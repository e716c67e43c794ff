// Watching a key: an async iterator of its states that survives failover.
//
// One subscription at a time, on one connection. When it ends:
// - the connection ends, or the node answers `E W <key> shutting-down`:
//   `W` again on another connection (at once the first time, then after
//   pauses growing from 100 ms to 1 s while no state comes);
// - `M <active> W <key>`: prefer that node and `W` there (at most 8 hops in
//   a row without a state, then pause); `M -`, or an active that cannot be
//   reached: pause and `W` again;
// - no first line within the request timeout: close that connection (it
//   reconnects) and `W` again elsewhere;
// - any other refusal (`too-many-watches`), or a refused secret: the
//   iterator throws that error once, then ends.
// The first line of every new subscription is yielded, even when it
// repeats the last state seen. At most MAX_BUFFERED states wait for a
// reader; past that the oldest is dropped (a slow reader skips states but
// always ends on the latest). Ended by return() (a `for await` loop's
// break), by its signal, or by the client's close().

import type { Conn, Sub, WatchEvent } from './conn.js';
import { MAX_REDIRECTS, NO_ACTIVE_RETRY_MS } from './calls.js';
import { ClosedError, RefusedError, UnavailableError } from './errors.js';
import type { Pool } from './pool.js';
import type { WatchState } from './wire.js';

export const MAX_PAUSE_MS = 1000;
export const MAX_BUFFERED = 1024;

interface Subscription {
  conn: Conn;
  generation: number;
  handle: Sub;
  answered: boolean;
  timer: NodeJS.Timeout | null;
}

type Waiter = { resolve: (r: IteratorResult<WatchState, undefined>) => void; reject: (e: unknown) => void };

/** The owner of watches: their client. */
export interface WatchOwner {
  readonly pool: Pool;
  readonly watches: Set<Watch>;
}

/** The states of a key, as an async iterator: `for await (const s of watch)`. */
export class Watch implements AsyncIterableIterator<WatchState, undefined> {
  /** Why the last subscription failed while the watch keeps trying (null
   * once a state came). */
  trouble: Error | null = null;
  private readonly buffer: WatchState[] = [];
  private readonly waiters: Waiter[] = [];
  private sub: Subscription | null = null;
  private failures = 0;
  private hops = 0;
  private lastToken: bigint | null = null;
  private ended = false;
  private error: Error | null = null;
  private pauseTimer: NodeJS.Timeout | null = null;
  private cancelWait: (() => void) | null = null;
  private readonly onAbort: (() => void) | null = null;

  /** @internal */
  constructor(
    private readonly owner: WatchOwner,
    readonly key: string,
    private readonly leadersOnly: boolean,
    private readonly signal?: AbortSignal,
  ) {
    owner.watches.add(this);
    if (signal !== undefined) {
      if (signal.aborted) {
        this.end(null);
        return;
      }
      this.onAbort = () => this.end(null);
      signal.addEventListener('abort', this.onAbort, { once: true });
    }
    this.subscribe();
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  next(): Promise<IteratorResult<WatchState, undefined>> {
    const state = this.buffer.shift();
    if (state !== undefined) return Promise.resolve({ value: state, done: false });
    if (this.error !== null) {
      const e = this.error;
      this.error = null;
      return Promise.reject(e);
    }
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Stop watching (what `break` in a `for await` loop calls). */
  return(): Promise<IteratorResult<WatchState, undefined>> {
    this.end(null);
    this.buffer.length = 0;
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Stop watching. */
  close(): void {
    void this.return();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }

  get isEnded(): boolean {
    return this.ended;
  }

  // --- the subscription ---------------------------------------------------------------

  private subscribe(): void {
    if (this.ended) return;
    const pool = this.owner.pool;
    let conn: Conn | null;
    try {
      conn = pool.tryPick('any');
    } catch (e) {
      if (e instanceof UnavailableError) return this.failedTry(e);
      return this.end(e as Error);
    }
    if (conn === null) {
      // A connection is coming up: try again at the next phase change.
      this.cancelWait = pool.onceChanged(() => {
        this.cancelWait = null;
        this.subscribe();
      });
      return;
    }
    const handle: Sub = { onEvent: (event) => this.onEvent(handle, event) };
    const generation = conn.watch(this.key, handle);
    if (generation === null) return this.failedTry(new UnavailableError(`${conn.addr} went down`));
    const sub: Subscription = { conn, generation, handle, answered: false, timer: null };
    const rt = pool.requestTimeoutMs;
    sub.timer = setTimeout(() => {
      sub.timer = null;
      if (this.sub !== sub || sub.answered) return;
      const why = `${sub.conn.addr} did not answer W ${this.key} within ${rt} ms`;
      sub.conn.kill(sub.generation, why);
      this.giveUpSubscription();
      this.failedTry(new UnavailableError(`no answer: ${why}`));
    }, rt);
    this.sub = sub;
  }

  private onEvent(handle: Sub, event: WatchEvent): void {
    const sub = this.sub;
    if (sub === null || sub.handle !== handle || this.ended) return;
    switch (event.kind) {
      case 'state': {
        if (!sub.answered) {
          sub.answered = true;
          if (sub.timer !== null) clearTimeout(sub.timer);
          sub.timer = null;
        }
        this.failures = 0;
        this.hops = 0;
        this.trouble = null;
        if (this.leadersOnly && this.lastToken === event.state.token) return;
        this.lastToken = event.state.token;
        return this.yield(event.state);
      }
      case 'moved': {
        this.giveUpSubscription();
        const pool = this.owner.pool;
        if (event.active === null) return this.failedTry(new UnavailableError('no active node: the servers know no active node'));
        let node: number;
        try {
          node = pool.nodeFor(event.active);
        } catch (e) {
          return this.failedTry(e as Error);
        }
        if (pool.isReachable(node) && this.hops < MAX_REDIRECTS) {
          this.hops++;
          pool.prefer(node);
          return this.subscribe();
        }
        return this.failedTry(new UnavailableError(`no active node: redirected to ${event.active}, which cannot be reached`));
      }
      case 'refused':
        this.giveUpSubscription();
        if (event.reason === 'shutting-down') return this.failedTry(new UnavailableError('no active node: the node is shutting down'));
        return this.end(new RefusedError(event.reason));
      case 'ended': {
        const addr = sub.conn.addr;
        this.dropSubscription();
        return this.failedTry(new UnavailableError(`no connection: the connection to ${addr} ended`));
      }
    }
  }

  private failedTry(why: Error): void {
    if (this.ended) return;
    this.trouble = why;
    this.failures++;
    const pause = this.failures <= 1 ? 0 : Math.min(NO_ACTIVE_RETRY_MS * 2 ** Math.min(this.failures - 2, 8), MAX_PAUSE_MS);
    this.pauseTimer = setTimeout(() => {
      this.pauseTimer = null;
      this.subscribe();
    }, pause);
  }

  /** The subscription is over on our side: `X` once its connection has no
   * other watch of the key. */
  private giveUpSubscription(): void {
    const sub = this.sub;
    if (sub === null) return;
    this.dropSubscription();
    sub.conn.unwatch(this.key, sub.generation, sub.handle);
  }

  private dropSubscription(): void {
    const sub = this.sub;
    if (sub === null) return;
    if (sub.timer !== null) clearTimeout(sub.timer);
    this.sub = null;
  }

  private yield(state: WatchState): void {
    const waiter = this.waiters.shift();
    if (waiter !== undefined) return waiter.resolve({ value: state, done: false });
    this.buffer.push(state);
    if (this.buffer.length > MAX_BUFFERED) this.buffer.shift();
  }

  /** End the watch: with an error (thrown once by next()), or quietly. */
  end(error: Error | null): void {
    if (this.ended) return;
    this.ended = true;
    this.owner.watches.delete(this);
    this.giveUpSubscription();
    if (this.pauseTimer !== null) clearTimeout(this.pauseTimer);
    this.pauseTimer = null;
    this.cancelWait?.();
    this.cancelWait = null;
    if (this.onAbort !== null) this.signal?.removeEventListener('abort', this.onAbort);
    const waiters = this.waiters.splice(0);
    if (error !== null && waiters.length > 0) {
      waiters[0]!.reject(error);
      for (const w of waiters.slice(1)) w.resolve({ value: undefined, done: true });
      return;
    }
    if (error !== null) this.error = error;
    for (const w of waiters) w.resolve({ value: undefined, done: true });
  }
}

/** The first state a watch yields within `budgetMs`, then the watch ends. */
export async function firstState(watch: Watch, budgetMs: number, signal?: AbortSignal): Promise<WatchState> {
  let timer: NodeJS.Timeout | null = null;
  let onAbort: (() => void) | null = null;
  try {
    const timeout = new Promise<'timeout'>((resolve, reject) => {
      timer = setTimeout(() => resolve('timeout'), budgetMs);
      if (signal !== undefined) {
        onAbort = () => reject(signal.reason);
        if (signal.aborted) onAbort();
        else signal.addEventListener('abort', onAbort, { once: true });
      }
    });
    const got = await Promise.race([watch.next(), timeout]);
    if (got === 'timeout') throw watch.trouble ?? new UnavailableError(`no answer: no state of ${watch.key} within ${budgetMs} ms`);
    if (got.done) throw new ClosedError();
    return got.value;
  } finally {
    if (timer !== null) clearTimeout(timer);
    if (onAbort !== null) signal?.removeEventListener('abort', onAbort);
    watch.close();
  }
}
