// baton-locks: the official TypeScript client of baton, a lock server.

export { Client, connect, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS } from './client.js';
export type { AcquireOptions, CallOptions, CampaignOptions, ConnectOptions, TlsOptions } from './client.js';
export { Grant, HeldGrant, KEEP_RETRY_MS } from './grant.js';
export type { GrantEvents } from './grant.js';
export { Watch } from './watch.js';
export type { KeyStatus } from './calls.js';
export type { WatchState } from './wire.js';
export { RELEASE_RETRY_INTERVAL_MS, RELEASE_RETRY_WINDOW_MS } from './calls.js';
export { RECONNECT_INTERVAL_MS } from './conn.js';
export {
  BadArgumentError,
  BatonError,
  ClosedError,
  LostError,
  RefusedError,
  TimeoutError,
  UnavailableError,
} from './errors.js';
export type { ErrorCode } from './errors.js';

/** The library's version. */
export const VERSION = '0.1.0';
