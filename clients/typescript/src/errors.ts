// The errors a call can end with, typed so callers can tell "the server
// said no" from "no server could be asked". Each has a stable `code`
// (the same words the conformance suite uses).

/** The `code` of every error this library throws. */
export type ErrorCode =
  | 'timeout'
  | 'refused'
  | 'unavailable'
  | 'lost'
  | 'closed'
  | 'bad-argument';

/** The base class of every error this library throws (never for an abort:
 * an aborted call rejects with its signal's `reason`, as Node's own APIs do). */
export class BatonError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string) {
    super(message);
    this.code = code;
    this.name = new.target.name;
  }
}

/** The server answered `T`: the key was not granted within the wait.
 * Nothing was granted, nothing is held. */
export class TimeoutError extends BatonError {
  declare readonly code: 'timeout';
  constructor(message = 'timed out: the key was not granted within the wait') {
    super('timeout', message);
  }
}

/** The server refused the request (`E <op> <key> <reason>`), or refused
 * this client's secret (`bad-auth`, `auth-required`). `reason` is the
 * server's word, e.g. `limit-mismatch`, `lease-too-long`, `bad-auth`. */
export class RefusedError extends BatonError {
  declare readonly code: 'refused';
  readonly reason: string;
  constructor(reason: string, message?: string) {
    super('refused', message ?? `refused by the server: ${reason}`);
    this.reason = reason;
  }
}

/** No server gave an answer: every connection failed on its attempt, none
 * is up, a server took the request and did not answer in time, or the
 * servers know no active node. Trying again later may succeed. */
export class UnavailableError extends BatonError {
  declare readonly code: 'unavailable';
  constructor(message: string) {
    super('unavailable', message);
  }
}

/** The grant no longer holds its key: its lease ran out (by the client's
 * clock, or on the server), or the server said the token does not hold it. */
export class LostError extends BatonError {
  declare readonly code: 'lost';
  constructor(message = 'the grant no longer holds its key') {
    super('lost', message);
  }
}

/** The client was closed, or the grant was already released. */
export class ClosedError extends BatonError {
  declare readonly code: 'closed';
  constructor(message = 'the client is closed') {
    super('closed', message);
  }
}

/** An argument was refused before anything was sent (a bad key, lease,
 * limit, value, address or secret). */
export class BadArgumentError extends BatonError {
  declare readonly code: 'bad-argument';
  constructor(message: string) {
    super('bad-argument', message);
  }
}

/** True for the errors after which trying again later may succeed. */
export function isUnavailable(e: unknown): e is UnavailableError {
  return e instanceof UnavailableError;
}
