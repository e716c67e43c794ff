// The wire format (protocol version 1): request lines out, answer lines in,
// and the checks that keep a bad argument from ever being sent. Pure: no
// I/O, no state.

import { BadArgumentError } from './errors.js';

/** Most bytes in a key or a value. */
export const MAX_KEY = 250;
/** Largest semaphore limit. */
export const MAX_LIMIT = 10_000;
/** Most bytes a line may have, its line ending included. */
export const MAX_LINE = 1024;
/** A secret's length bounds. */
export const MIN_SECRET = 16;
export const MAX_SECRET = 128;
/** The largest u64. */
export const U64_MAX = (1n << 64n) - 1n;

export type Request =
  | { op: 'A'; key: string; leaseMs: number; waitMs: number; limit?: number; value?: string }
  | { op: 'R'; key: string; token: bigint }
  | { op: 'K'; key: string; token: bigint; leaseMs: number }
  | { op: 'Q'; key: string }
  | { op: 'I' }
  | { op: 'W'; key: string }
  | { op: 'X'; key: string }
  | { op: 'U'; secret: string };

export type Answer =
  | { kind: 'A'; token: bigint; key: string; slot: number | null }
  | { kind: 'T'; key: string }
  | { kind: 'R'; key: string }
  | { kind: 'N'; key: string }
  | { kind: 'K'; key: string }
  | { kind: 'Q'; key: string; token: bigint; msLeft: number; waiting: number }
  | { kind: 'M'; active: string | null; op: string; key: string | null }
  | { kind: 'E'; op: string | null; key: string | null; reason: string }
  | { kind: 'I'; pairs: Record<string, string> }
  | { kind: 'W'; key: string; state: WatchState }
  | { kind: 'X'; key: string }
  | { kind: 'U' };

/** A key's holders, as a watch line (or `leader`) tells them. */
export interface WatchState {
  /** The largest token holding the key now; 0n when nobody holds it. */
  readonly token: bigint;
  /** How many grants hold the key. */
  readonly holders: number;
  /** How many requests wait in line. */
  readonly waiting: number;
  /** The value of the newest grant; null when none or without a value. */
  readonly value: string | null;
}

/** Milliseconds as the wire's seconds with up to 3 decimals. */
export function seconds(ms: number): string {
  const whole = Math.floor(ms / 1000);
  const frac = ms % 1000;
  if (frac === 0) return String(whole);
  return `${whole}.${String(frac).padStart(3, '0').replace(/0+$/, '')}`;
}

/** The line for a request, with its `\n`. */
export function encode(r: Request): string {
  switch (r.op) {
    case 'A': {
      let line = `A ${r.key} ${seconds(r.leaseMs)} ${seconds(r.waitMs)}`;
      if (r.limit !== undefined) line += ` ${r.limit}`;
      if (r.value !== undefined) line += ` ${r.value}`;
      return line + '\n';
    }
    case 'R':
      return `R ${r.key} ${r.token}\n`;
    case 'K':
      return `K ${r.key} ${r.token} ${seconds(r.leaseMs)}\n`;
    case 'Q':
    case 'W':
    case 'X':
      return `${r.op} ${r.key}\n`;
    case 'I':
      return 'I\n';
    case 'U':
      return `U ${r.secret}\n`;
  }
}

/** The key a request is matched by ('' for `I`). */
export function requestKey(r: Request): string {
  return 'key' in r ? r.key : '';
}

const DIGITS = /^[0-9]+$/;

function u64(text: string | undefined): bigint | null {
  if (text === undefined || !DIGITS.test(text) || text.length > 20) return null;
  const n = BigInt(text);
  return n <= U64_MAX ? n : null;
}

function count(text: string | undefined): number | null {
  if (text === undefined || !DIGITS.test(text) || text.length > 15) return null;
  return Number(text);
}

/** One answer line (without its line ending), parsed; null when it makes
 * no sense (the connection is then out of step and is closed). */
export function parseAnswer(line: string): Answer | null {
  const f = line.split(' ');
  const key = f[1];
  switch (f[0]) {
    case 'A': {
      const token = u64(f[1]);
      if (token === null || f[2] === undefined || f.length > 4) return null;
      let slot: number | null = null;
      if (f.length === 4) {
        slot = count(f[3]);
        if (slot === null) return null;
      }
      return { kind: 'A', token, key: f[2], slot };
    }
    case 'T':
    case 'R':
    case 'N':
    case 'K':
    case 'X':
      if (key === undefined || f.length !== 2) return null;
      return { kind: f[0], key };
    case 'Q': {
      if (f.length !== 5 || key === undefined) return null;
      const token = u64(f[2]);
      const msLeft = count(f[3]);
      const waiting = count(f[4]);
      if (token === null || msLeft === null || waiting === null) return null;
      return { kind: 'Q', key, token, msLeft, waiting };
    }
    case 'W': {
      if (f.length !== 6 || key === undefined) return null;
      const token = u64(f[2]);
      const holders = count(f[3]);
      const waiting = count(f[4]);
      const value = f[5];
      if (token === null || holders === null || waiting === null || value === undefined) return null;
      return { kind: 'W', key, state: { token, holders, waiting, value: value === '-' ? null : value } };
    }
    case 'M': {
      if (f.length !== 4) return null;
      return { kind: 'M', active: f[1] === '-' ? null : f[1]!, op: f[2]!, key: f[3] === '-' ? null : f[3]! };
    }
    case 'E': {
      if (f.length !== 4) return null;
      return { kind: 'E', op: f[1] === '-' ? null : f[1]!, key: f[2] === '-' ? null : f[2]!, reason: f[3]! };
    }
    case 'I': {
      const pairs: Record<string, string> = {};
      for (const field of f.slice(1)) {
        const eq = field.indexOf('=');
        if (eq > 0) pairs[field.slice(0, eq)] = field.slice(eq + 1);
      }
      return { kind: 'I', pairs };
    }
    case 'U':
      return f.length === 2 && f[1] === 'ok' ? { kind: 'U' } : null;
    default:
      return null;
  }
}

/** The (op, key) of the request an answer belongs to; null for `E - -`
 * (about the connection, which the server closes after it). */
export function answerRoute(a: Answer): [string, string] | null {
  switch (a.kind) {
    case 'A':
    case 'T':
      return ['A', a.key];
    case 'R':
    case 'N':
      return ['R', a.key];
    case 'K':
    case 'Q':
    case 'X':
    case 'W':
      return [a.kind, a.key];
    case 'I':
      return ['I', ''];
    case 'U':
      return ['U', ''];
    case 'M':
      return [a.op, a.key ?? ''];
    case 'E':
      return a.op === null ? null : [a.op, a.key ?? ''];
  }
}

// --- checks, before anything is sent ------------------------------------------

function isKeyBytes(text: string): boolean {
  const bytes = Buffer.byteLength(text, 'utf8');
  if (bytes < 1 || bytes > MAX_KEY) return false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c <= 0x20 || c === 0x7f) return false;
    // A lone surrogate would not survive UTF-8: refuse it rather than send U+FFFD.
    if (c >= 0xd800 && c <= 0xdfff) {
      const next = text.charCodeAt(i + 1);
      if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) i++;
      else return false;
    }
  }
  return true;
}

export function checkKey(key: unknown): string {
  if (typeof key !== 'string' || !isKeyBytes(key)) {
    throw new BadArgumentError(
      `bad key ${JSON.stringify(key)}: 1 to ${MAX_KEY} bytes, no spaces or control characters`,
    );
  }
  return key;
}

export function checkValue(value: unknown): string {
  if (typeof value !== 'string' || !isKeyBytes(value) || value === '-') {
    throw new BadArgumentError(
      `bad value ${JSON.stringify(value)}: 1 to ${MAX_KEY} bytes, no spaces or control characters, not "-" alone`,
    );
  }
  return value;
}

export function checkLimit(limit: unknown): number {
  if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    throw new BadArgumentError(`bad limit ${String(limit)}: an integer, 1 to ${MAX_LIMIT}`);
  }
  return limit;
}

/** A duration in ms, rounded up to a whole ms; `what` names it in errors. */
export function checkMs(ms: unknown, what: string, allowZero: boolean): number {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0 || ms > 2 ** 42) {
    throw new BadArgumentError(`bad ${what} ${String(ms)}: milliseconds, a finite number`);
  }
  const whole = Math.ceil(ms);
  if (whole === 0 && !allowZero) throw new BadArgumentError(`the ${what} must be above 0`);
  return whole;
}

export function checkToken(token: unknown): bigint {
  if (typeof token !== 'bigint' || token <= 0n || token > U64_MAX) {
    throw new BadArgumentError(`bad token ${String(token)}: a bigint, 1 to 2^64-1`);
  }
  return token;
}

export function checkSecret(secret: unknown): string {
  if (typeof secret !== 'string' || secret.length < MIN_SECRET || secret.length > MAX_SECRET || !/^[\x21-\x7e]+$/.test(secret)) {
    throw new BadArgumentError(
      `the secret must be ${MIN_SECRET} to ${MAX_SECRET} bytes of printable ASCII without spaces`,
    );
  }
  return secret;
}

export const DEFAULT_PORT = 7373;

/** `host:port` (`host` alone gets port 7373, `[v6]` too), trimmed. */
export function normaliseAddress(addr: unknown): string {
  const bad = () => new BadArgumentError(`${JSON.stringify(addr)} is not host:port`);
  if (typeof addr !== 'string') throw bad();
  const s = addr.trim();
  if (s === '' || /\s/.test(s)) throw bad();
  let host: string;
  let port: string | null;
  if (s.startsWith('[')) {
    const close = s.indexOf(']');
    if (close < 0) throw bad();
    host = s.slice(1, close);
    const after = s.slice(close + 1);
    if (after === '') port = null;
    else if (after.startsWith(':')) port = after.slice(1);
    else throw bad();
  } else {
    const colon = s.indexOf(':');
    if (colon < 0) {
      host = s;
      port = null;
    } else {
      host = s.slice(0, colon);
      port = s.slice(colon + 1);
      if (port.includes(':')) throw bad();
    }
  }
  if (host === '') throw bad();
  if (port === null) return `${s}:${DEFAULT_PORT}`;
  if (!/^[0-9]{1,5}$/.test(port) || Number(port) > 65535) throw bad();
  return s;
}

/** The host and port of a normalised address. */
export function splitAddress(addr: string): { host: string; port: number } {
  const colon = addr.lastIndexOf(':');
  let host = addr.slice(0, colon);
  if (host.startsWith('[') && host.endsWith(']')) host = host.slice(1, -1);
  return { host, port: Number(addr.slice(colon + 1)) };
}
