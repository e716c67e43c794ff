// The calls: how one request becomes one result, across dropped
// connections, redirects and deadlines. The rules, written once:
//
// - an attempt whose connection drops moves to the next connection; the
//   call fails only after as many failed attempts as there are registered
//   connections (an answer `E <op> <key> shutting-down` counts as failed);
// - `M host:port`: prefer that node from now on (registering it if new)
//   and send again; `M -`, or a redirect to a node that is down: wait
//   NO_ACTIVE_RETRY_MS and send again, for up to the request timeout; at
//   most MAX_REDIRECTS redirects per call;
// - a grant answered after more than a third of its lease (it waited in
//   line) is confirmed at once with `K`;
// - a release is retried for RELEASE_RETRY_WINDOW_MS at
//   RELEASE_RETRY_INTERVAL_MS while no connection can carry it; `N` after
//   an attempt that may have reached the server counts as released;
// - deadlines: a connection has the request timeout to answer (an acquire:
//   its wait plus the request timeout; one without a wait limit: no limit),
//   else it is closed; the caller's own deadline may be earlier;
// - a grant that arrives after its caller gave up is released at once.
//
// Never does: touch sockets (conn.ts) or choose connections (pool.ts).

import type { Conn, Slot } from './conn.js';
import { BatonError, ClosedError, LostError, RefusedError, TimeoutError, UnavailableError } from './errors.js';
import type { Pool, Target } from './pool.js';
import type { Answer, Request } from './wire.js';

export const RELEASE_RETRY_WINDOW_MS = 5000;
export const RELEASE_RETRY_INTERVAL_MS = 200;
export const NO_ACTIVE_RETRY_MS = 100;
export const MAX_REDIRECTS = 8;
export const ACQUIRE_ROUNDS = 3;

const now = () => performance.now();

type Attempt =
  | { kind: 'answered'; answer: Answer; sentAt: number }
  | { kind: 'lost'; sent: boolean }
  | { kind: 'overdue'; why: string }
  /** An acquire's caller's deadline passed while the server held its
   * answer (a T) back behind an earlier acquire of the key on the
   * connection. */
  | { kind: 'held-back' }
  | { kind: 'unreachable'; error: Error };

export interface Exchanged {
  answer: Answer;
  sentAt: number;
  /** An earlier attempt of this call may have reached the server. */
  earlierMaybeDelivered: boolean;
}

/** A call that failed, and whether an attempt may have reached the server. */
export class Failure {
  constructor(
    readonly error: Error,
    readonly maybeDelivered: boolean,
  ) {}
}

/** How long a connection has to answer a request (null: no limit). */
export function answerBudget(request: Request, requestTimeoutMs: number): number | null {
  if (request.op === 'A') return request.waitMs === 0 ? null : request.waitMs + requestTimeoutMs;
  return requestTimeoutMs;
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** Which deadline of a request still unanswered has passed at `at`, for a
 * request that reached the front of its (op, key) line on its connection at
 * `frontAt` (null: not yet, it is held back behind an earlier one), with the
 * connection's `budget` (null: no limit) and the caller's deadline `due`:
 * 'conn-overdue' (the connection is deemed dead), 'caller-overdue',
 * 'held-back' (the caller's deadline, while the server was entitled to hold
 * the answer back), or null. Pure. */
export function pastDeadline(at: number, budget: number | null, frontAt: number | null, due: number | null): 'conn-overdue' | 'caller-overdue' | 'held-back' | null {
  if (budget !== null && frontAt !== null && at >= frontAt + budget - 1) return 'conn-overdue';
  if (due !== null && at >= due) return frontAt === null ? 'held-back' : 'caller-overdue';
  return null;
}

/** Send on `conn` and wait for the answer, the connection's end, the
 * connection's deadline (`budget` from when the request reached the front
 * of its (op, key) line there, which closes it) or the caller's. */
function sendAndWait(conn: Conn, request: Request, budget: number | null, callerDue: number | null, signal?: AbortSignal): Promise<Attempt> {
  return new Promise<Attempt>((resolve, reject) => {
    let timer: NodeJS.Timeout | null = null;
    const sentAt = now();
    const finish = () => {
      if (timer !== null) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    const slot: Slot = {
      abandoned: false,
      frontAt: null,
      sentAt,
      settle(answer: Answer | null) {
        finish();
        resolve(answer === null ? { kind: 'lost', sent: true } : { kind: 'answered', answer, sentAt });
      },
    };
    const onAbort = () => {
      slot.abandoned = true;
      finish();
      reject(signal!.reason);
    };
    if (!conn.send(request, slot)) {
      resolve({ kind: 'lost', sent: false });
      return;
    }
    const generation = conn.generation;
    // Look again at the earlier deadline; while the request is held back,
    // the connection's is a budget from now.
    const watch = () => {
      const check = budget === null ? null : (slot.frontAt ?? now()) + budget;
      const due = check === null ? callerDue : callerDue === null ? check : Math.min(check, callerDue);
      if (due === null) return;
      timer = setTimeout(() => {
        const verdict = pastDeadline(now(), budget, slot.frontAt, callerDue);
        if (verdict === null) return watch();
        slot.abandoned = true;
        finish();
        if (verdict === 'held-back' && request.op === 'A') return resolve({ kind: 'held-back' });
        const waited = Math.round(now() - sentAt);
        if (verdict === 'conn-overdue') conn.kill(generation, `no answer within ${waited} ms`);
        resolve({ kind: 'overdue', why: `${conn.addr} did not answer within ${waited} ms` });
      }, Math.max(0, due - now()));
    };
    watch();
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

async function attempt(pool: Pool, target: Target, request: Request, due: number | null, signal?: AbortSignal): Promise<Attempt> {
  let conn: Conn;
  try {
    conn = await pool.pick(target, due, signal, request.op === 'A' ? request.key : undefined);
  } catch (e) {
    if (signal?.aborted) throw signal.reason;
    return { kind: 'unreachable', error: e as Error };
  }
  return sendAndWait(conn, request, answerBudget(request, pool.requestTimeoutMs), due, signal);
}

/** One request to one result: failover, redirects and deadlines. Throws a
 * Failure (or the signal's reason when aborted). */
export async function exchange(pool: Pool, target: Target, due: number | null, make: () => Request, signal?: AbortSignal): Promise<Exchanged> {
  let failures = 0;
  let delivered = false;
  let hops = 0;
  let waitingSince: number | null = null;
  const fail = (error: Error) => new Failure(error, delivered);
  for (;;) {
    if (signal?.aborted) throw signal.reason;
    let request: Request;
    try {
      request = make();
    } catch (e) {
      throw fail(e as Error);
    }
    const outcome = await attempt(pool, target, request, due, signal);
    switch (outcome.kind) {
      case 'answered': {
        const answer = outcome.answer;
        if (answer.kind === 'M') {
          // Follow a redirect, or pause while no active is known.
          let pause = true;
          if (answer.active !== null) {
            let node: number;
            try {
              node = pool.nodeFor(answer.active);
            } catch (e) {
              throw fail(e as Error);
            }
            if (pool.isReachable(node)) {
              hops++;
              if (hops > MAX_REDIRECTS) {
                throw fail(new UnavailableError(`no active node: redirected ${MAX_REDIRECTS} times without reaching it (last: ${answer.active})`));
              }
              pool.prefer(node);
              waitingSince = null;
              pause = false;
            }
          }
          if (pause) {
            waitingSince ??= now();
            const wake = now() + NO_ACTIVE_RETRY_MS;
            if (now() - waitingSince >= pool.requestTimeoutMs || (due !== null && wake >= due)) {
              const why =
                answer.active !== null
                  ? `redirected to ${answer.active}, which cannot be reached`
                  : `the servers know no active node (waited ${Math.round(now() - waitingSince)} ms)`;
              throw fail(new UnavailableError(`no active node: ${why}`));
            }
            await sleep(NO_ACTIVE_RETRY_MS, signal);
          }
          continue;
        }
        if (answer.kind === 'E' && answer.reason === 'shutting-down') {
          failures++;
          break;
        }
        return { answer, sentAt: outcome.sentAt, earlierMaybeDelivered: delivered };
      }
      case 'lost':
        delivered ||= outcome.sent;
        failures++;
        break;
      case 'overdue':
        delivered = true;
        throw fail(new UnavailableError(`no answer: ${outcome.why}`));
      case 'held-back':
        // Its wait ran out long ago: the answer held back is a T (a grant
        // that comes instead is released, its caller gone).
        delivered = true;
        throw fail(new TimeoutError());
      case 'unreachable':
        throw fail(outcome.error);
    }
    if (failures < pool.connectionCount(target)) continue;
    throw fail(pool.noConnection(target, `the connection failed on each of ${failures} attempts: `));
  }
}

/** `exchange`, its Failure unwrapped to the error. */
async function call(pool: Pool, target: Target, due: number | null, request: Request, signal?: AbortSignal): Promise<Exchanged> {
  try {
    return await exchange(pool, target, due, () => request, signal);
  } catch (e) {
    throw e instanceof Failure ? e.error : e;
  }
}

function unexpected(answer: Answer): Error {
  if (answer.kind === 'E') return new RefusedError(answer.reason);
  return new UnavailableError(`protocol error: unexpected answer ${answer.kind}`);
}

// --- acquire --------------------------------------------------------------------

export interface Ask {
  limit?: number;
  value?: string;
}

/** A grant's plain data: the lease is counted from when its request was sent. */
export interface GrantData {
  key: string;
  token: bigint;
  slot: number;
  leaseMs: number;
  leaseStart: number;
}

export function expiresAt(g: GrantData): number {
  return g.leaseStart + g.leaseMs;
}

/** A grant, or ClosedError and the rest. The grant is in hand (counted by
 * the pool since its connection delivered it) and stays so when it is
 * returned: the caller ends that with `pool.handOut()` once it has checked
 * that the client is not closing; on every other way out it ends here. */
export async function acquire(pool: Pool, key: string, leaseMs: number, waitMs: number | null, ask: Ask, signal?: AbortSignal): Promise<GrantData> {
  const waitEnd = waitMs === null ? null : now() + waitMs;
  for (let round = 0; round < ACQUIRE_ROUNDS; round++) {
    const make = (): Request => {
      let wait = 0;
      if (waitEnd !== null) {
        wait = Math.ceil(waitEnd - now());
        if (wait <= 0) throw new TimeoutError();
      }
      return { op: 'A', key, leaseMs, waitMs: wait, ...ask };
    };
    const due = waitEnd === null ? null : waitEnd + pool.requestTimeoutMs;
    let done: Exchanged;
    try {
      done = await exchange(pool, 'any', due, make, signal);
    } catch (e) {
      throw e instanceof Failure ? e.error : e;
    }
    const answer = done.answer;
    if (answer.kind === 'T') throw new TimeoutError();
    if (answer.kind !== 'A') throw unexpected(answer);
    const grant: GrantData = { key: answer.key, token: answer.token, slot: answer.slot ?? 0, leaseMs, leaseStart: done.sentAt };
    let confirmed: GrantData | null;
    try {
      confirmed = await confirmInHand(pool, grant, signal);
    } catch (e) {
      pool.handOut();
      throw e;
    }
    if (confirmed !== null) return confirmed;
    pool.handOut();
    if (pool.closed) throw new ClosedError();
    pool.log(`a grant of ${key} ran out before it arrived; asking again`);
  }
  throw new LostError('the grant ran out before it arrived, three times');
}

/** A grant in hand, confirmed with K if it waited in line (so that its
 * lease, counted from the send time, does not look spent on arrival); null
 * when it ran out before it arrived. A client found closing, once the
 * grant is in hand or once its K is answered, gets the grant released
 * (awaited: close waits for it) and ClosedError. */
async function confirmInHand(pool: Pool, grant: GrantData, signal?: AbortSignal): Promise<GrantData | null> {
  const closing = async (): Promise<never> => {
    await pool.releaseClosing(grant);
    throw new ClosedError();
  };
  if (pool.closed) return closing();
  if (signal?.aborted) {
    releaseUnwanted(pool, grant);
    throw signal.reason;
  }
  if (now() - grant.leaseStart <= grant.leaseMs / 3) return grant;
  let confirmed: Exchanged | null = null;
  try {
    confirmed = await call(pool, 'any', now() + pool.requestTimeoutMs, { op: 'K', key: grant.key, token: grant.token, leaseMs: grant.leaseMs }, signal);
  } catch (e) {
    if (pool.closed) return closing();
    if (signal?.aborted) {
      releaseUnwanted(pool, grant);
      throw signal.reason;
    }
    pool.log(`confirming ${grant.key}: ${(e as Error).message}`);
  }
  if (confirmed !== null && confirmed.answer.kind === 'E' && confirmed.answer.reason === 'not-held') return null;
  if (pool.closed) return closing();
  if (confirmed !== null && confirmed.answer.kind === 'K') return { ...grant, leaseStart: confirmed.sentAt };
  return grant;
}

/** Release a grant nobody will use (its caller gave up), once, unawaited. */
export function releaseUnwanted(pool: Pool, grant: { key: string; token: bigint }): void {
  let conn: Conn | null = null;
  try {
    conn = pool.tryPick('any');
  } catch {
    conn = null;
  }
  if (conn !== null && conn.send({ op: 'R', key: grant.key, token: grant.token }, null)) {
    pool.log(`releasing ${grant.key} (token ${grant.token}): its caller gave up`);
  } else {
    pool.log(`could not release ${grant.key} (token ${grant.token}), whose caller gave up: no connection is up; its lease will run out`);
  }
}

// --- release --------------------------------------------------------------------

export type ReleaseOutcome = 'released' | 'not-held';

export async function release(pool: Pool, key: string, token: bigint): Promise<ReleaseOutcome> {
  const request: Request = { op: 'R', key, token };
  const retryEnd = now() + RELEASE_RETRY_WINDOW_MS;
  const due = retryEnd + pool.requestTimeoutMs;
  let delivered = false;
  for (;;) {
    try {
      const done = await exchange(pool, 'any', due, () => request);
      return releaseOutcome(done, delivered);
    } catch (e) {
      if (!(e instanceof Failure)) throw e;
      delivered ||= e.maybeDelivered;
      const late = now() + RELEASE_RETRY_INTERVAL_MS > retryEnd;
      if (late || !(e.error instanceof UnavailableError)) throw e.error;
      pool.log(`release of token ${token} failed, retrying: ${e.error.message}`);
    }
    await sleep(RELEASE_RETRY_INTERVAL_MS);
  }
}

/** `N` after an attempt that may have got through means it did. */
export function releaseOutcome(done: Exchanged, delivered: boolean): ReleaseOutcome {
  const maybeDelivered = delivered || done.earlierMaybeDelivered;
  switch (done.answer.kind) {
    case 'R':
      return 'released';
    case 'N':
      return maybeDelivered ? 'released' : 'not-held';
    default:
      throw unexpected(done.answer);
  }
}

// --- keep, query, info ------------------------------------------------------------

/** Extend a grant's lease; the new lease is counted from the send time.
 * LostError when the server says the token no longer holds the key, or the
 * lease runs out (by the client's clock) before a server answers. */
export async function keep(pool: Pool, grant: GrantData, leaseMs: number, signal?: AbortSignal): Promise<GrantData> {
  if (now() >= expiresAt(grant)) throw new LostError('the lease ran out');
  try {
    const done = await call(pool, 'any', expiresAt(grant), { op: 'K', key: grant.key, token: grant.token, leaseMs }, signal);
    const answer = done.answer;
    if (answer.kind === 'K') return { ...grant, leaseMs, leaseStart: done.sentAt };
    if (answer.kind === 'E' && answer.reason === 'not-held') throw new LostError('the key is no longer held by this token');
    throw unexpected(answer);
  } catch (e) {
    if (e instanceof UnavailableError && now() >= expiresAt(grant)) throw new LostError(`the lease ran out before a server answered (${e.message})`);
    throw e;
  }
}

/** Keep a grant known only by its key and token. */
export async function keepToken(pool: Pool, key: string, token: bigint, leaseMs: number, signal?: AbortSignal): Promise<void> {
  const done = await call(pool, 'any', now() + pool.requestTimeoutMs, { op: 'K', key, token, leaseMs }, signal);
  if (done.answer.kind === 'K') return;
  if (done.answer.kind === 'E' && done.answer.reason === 'not-held') throw new LostError('the key is no longer held by this token');
  throw unexpected(done.answer);
}

/** Who holds a key: the newest grant's token (0n when free), its time left, how many wait. */
export interface KeyStatus {
  readonly token: bigint;
  readonly msLeft: number;
  readonly waiting: number;
}

export async function query(pool: Pool, key: string, signal?: AbortSignal): Promise<KeyStatus> {
  const done = await call(pool, 'any', now() + pool.requestTimeoutMs, { op: 'Q', key }, signal);
  const a = done.answer;
  if (a.kind === 'Q') return { token: a.token, msLeft: a.msLeft, waiting: a.waiting };
  throw unexpected(a);
}

export async function info(pool: Pool, node: number, signal?: AbortSignal): Promise<Record<string, string>> {
  const done = await call(pool, node, now() + pool.connectTimeoutMs + pool.requestTimeoutMs, { op: 'I' }, signal);
  if (done.answer.kind === 'I') return done.answer.pairs;
  throw unexpected(done.answer);
}

export function isBatonError(e: unknown): e is BatonError {
  return e instanceof BatonError;
}
