// Grants: a plain one (released by the caller, kept by the caller) and a
// held one, whose lease a background keep-alive renews every third of it.
//
// A held grant is lost when a keep is answered `N` / `E K <key> not-held`
// (or refused), or its lease runs out by the client's clock before a keep
// gets through (keeps are retried every KEEP_RETRY_MS while no server
// answers). It then says so at once — `lost` resolves, `signal` aborts,
// a 'lost' event is emitted — and every later call on it fails LostError.
// It is never acquired again silently.

import { EventEmitter } from 'node:events';

import { type GrantData, expiresAt, keep, release } from './calls.js';
import { ClosedError, LostError, UnavailableError } from './errors.js';
import type { Pool } from './pool.js';
import { checkMs } from './wire.js';

export const KEEP_RETRY_MS = 200;

/** What a grant needs of its client. */
export interface Owner {
  readonly pool: Pool;
  readonly closed: boolean;
  readonly held: Set<HeldGrant>;
}

type State = 'held' | 'releasing' | 'released' | 'lost';

/** The events of a held grant: 'lost', once, with the LostError. */
export interface GrantEvents {
  lost: [error: LostError];
}

/** A grant of a key: its fencing token, its slot (0 for a mutex), and its
 * lease, counted by the client's clock from when the acquire was sent (so
 * it errs early). Release it with `release()`, or with `await using`. */
export class Grant extends EventEmitter {
  /** The fencing token: hand it to the resource you protect. */
  readonly token: bigint;
  readonly key: string;
  /** The slot of a semaphore (0 to limit-1); 0 for a mutex. */
  readonly slot: number;
  protected data: GrantData;
  protected state: State = 'held';
  protected lostError: LostError | null = null;

  /** @internal */
  constructor(
    protected readonly owner: Owner,
    data: GrantData,
  ) {
    super();
    this.token = data.token;
    this.key = data.key;
    this.slot = data.slot;
    this.data = data;
  }

  /** The lease asked for, in ms. */
  get leaseMs(): number {
    return this.data.leaseMs;
  }

  /** Milliseconds left on the lease by the client's clock (0 when spent). */
  get msLeft(): number {
    return Math.max(0, Math.floor(expiresAt(this.data) - performance.now()));
  }

  /** True once the grant is known lost. */
  get isLost(): boolean {
    return this.state === 'lost';
  }

  /** True once released. */
  get isReleased(): boolean {
    return this.state === 'released';
  }

  protected check(): void {
    if (this.owner.closed) throw new ClosedError();
    if (this.state === 'lost') throw this.lostError ?? new LostError();
    if (this.state !== 'held') throw new ClosedError('the grant was already released');
  }

  /** Release the key. Retried for 5 s while no server can be reached; a
   * retry answered `N` means an earlier attempt got through. Rejects
   * LostError when the grant no longer held the key, ClosedError when it
   * was already released (or the client closed), UnavailableError when
   * the retries ran out. */
  async release(): Promise<void> {
    this.check();
    this.state = 'releasing';
    this.stop();
    let outcome;
    try {
      outcome = await release(this.owner.pool, this.key, this.token);
    } catch (e) {
      // Not released: the caller may try again.
      this.state = 'held';
      throw e;
    }
    if (outcome === 'not-held') {
      this.markLost(new LostError('the key was no longer held by this token'));
      throw this.lostError!;
    }
    this.state = 'released';
  }

  /** Extend the lease to `leaseMs` from now. Rejects LostError when the
   * server says the token no longer holds the key, or the lease ran out
   * before a server answered. */
  async keep(leaseMs: number, options: { signal?: AbortSignal } = {}): Promise<void> {
    const ms = checkMs(leaseMs, 'lease', false);
    this.check();
    try {
      this.data = await keep(this.owner.pool, this.data, ms, options.signal);
    } catch (e) {
      if (e instanceof LostError && this.state === 'held') this.markLost(e);
      throw e;
    }
  }

  /** `await using grant = await client.acquire(...)` releases it at the end
   * of the block. A grant already released or lost is no error here. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.state !== 'held' || this.owner.closed) return;
    try {
      await this.release();
    } catch (e) {
      if (e instanceof LostError || e instanceof ClosedError) return;
      throw e;
    }
  }

  /** Stop background work (none for a plain grant). */
  protected stop(): void {}

  protected markLost(error: LostError): void {
    this.state = 'lost';
    this.lostError = error;
  }

  override toString(): string {
    return `Grant(${this.key}, token ${this.token}, slot ${this.slot})`;
  }
}

/** A grant kept alive in the background (`hold`, `campaign`). `lost`
 * resolves, `signal` aborts and a 'lost' event is emitted the moment it is
 * lost; releasing it (or closing the client) stops the keep-alive. */
export class HeldGrant extends Grant {
  /** Resolves with the reason when the grant is lost (never rejects; stays
   * pending if it is released first). */
  readonly lost: Promise<LostError>;
  private readonly controller = new AbortController();
  private resolveLost!: (e: LostError) => void;
  private stopped = false;
  private timer: NodeJS.Timeout | null = null;
  private wake: (() => void) | null = null;

  /** @internal */
  constructor(owner: Owner, data: GrantData) {
    super(owner, data);
    this.lost = new Promise((resolve) => (this.resolveLost = resolve));
    owner.held.add(this);
    // A 'lost' listener that throws surfaces as any listener's error does.
    this.keepAlive().catch((e: unknown) =>
      process.nextTick(() => {
        throw e;
      }),
    );
  }

  /** Aborted (with the LostError as its reason) when the grant is lost:
   * pass it to the work done under the lock. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  protected override stop(): void {
    this.stopped = true;
    this.owner.held.delete(this);
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.wake?.();
  }

  /** @internal The client closed: stop keeping it, say nothing. Returns
   * what to release. */
  abandon(): { key: string; token: bigint } | null {
    const wasHeld = this.state === 'held';
    this.stop();
    return wasHeld ? { key: this.key, token: this.token } : null;
  }

  protected override markLost(error: LostError): void {
    if (this.state === 'lost') return;
    super.markLost(error);
    this.stop();
    this.resolveLost(error);
    this.controller.abort(error);
    this.emit('lost', error);
  }

  /** A pause the keep-alive sleeps through, cut short by stop(); the
   * timer never keeps the process alive. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        if (this.timer !== null) clearTimeout(this.timer);
        this.timer = null;
        this.wake = null;
        resolve();
      };
      this.wake = done;
      this.timer = setTimeout(done, Math.max(0, ms));
      this.timer.unref();
    });
  }

  private async keepAlive(): Promise<void> {
    const leaseMs = this.data.leaseMs;
    while (!this.stopped) {
      await this.pause(this.data.leaseStart + leaseMs / 3 - performance.now());
      if (this.stopped) return;
      for (;;) {
        try {
          this.data = await keep(this.owner.pool, this.data, leaseMs);
          break;
        } catch (e) {
          if (this.stopped) return;
          if (e instanceof LostError) return this.markLost(e);
          if (!(e instanceof UnavailableError)) {
            return this.markLost(new LostError(`a keep was refused: ${(e as Error).message}`));
          }
        }
        await this.pause(KEEP_RETRY_MS);
        if (this.stopped) return;
        if (performance.now() >= expiresAt(this.data)) {
          return this.markLost(new LostError('the lease ran out before a keep got through'));
        }
      }
    }
  }
}

export interface HeldGrant {
  on(event: 'lost', listener: (error: LostError) => void): this;
  once(event: 'lost', listener: (error: LostError) => void): this;
  off(event: 'lost', listener: (error: LostError) => void): this;
}
