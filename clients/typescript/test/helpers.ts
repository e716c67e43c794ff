// Test support: real batond processes on 127.0.0.1 (free ports), killed
// when their test ends; a scripted fake server; deadline-bounded polls.

import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const DEADLINE_MS = 20_000;
const here = dirname(fileURLToPath(import.meta.url));
/** The repository root (clients/typescript/dist-test is three below it). */
export const REPO = resolve(here, '..', '..', '..');

export function batondPath(): string {
  return process.env['BATON_BATOND'] ?? join(REPO, 'target', 'release', 'batond');
}

let help: string | null = null;
function batondHelp(): string {
  help ??= spawnSync(batondPath(), ['--help'], { encoding: 'utf8', timeout: 10_000 }).stdout ?? '';
  return help;
}

export function hasFlag(flag: string): boolean {
  return batondHelp().includes(flag);
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export async function waitFor<T>(what: string, check: () => T | Promise<T>, deadlineMs = DEADLINE_MS): Promise<NonNullable<T>> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const v = await check();
    if (v) return v as NonNullable<T>;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export function tmpDir(): string {
  return mkdtempSync(join(tmpdir(), 'baton-ts-'));
}

/** A running batond. */
export class Node {
  readonly addr: string;
  readonly log: string[] = [];
  private constructor(
    readonly port: number,
    readonly proc: ChildProcess,
  ) {
    this.addr = `127.0.0.1:${port}`;
  }

  static async start(args: string[] = [], port?: number): Promise<Node> {
    const p = port ?? (await freePort());
    const proc = spawn(batondPath(), ['--bind', '127.0.0.1', '--port', String(p), '--threads', '1', ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, RUST_LOG: process.env['BATON_TEST_LOG'] ?? 'info' },
    });
    const node = new Node(p, proc);
    started.add(node);
    let text = '';
    const listening = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`batond did not start: ${text}`)), DEADLINE_MS);
      proc.stderr!.setEncoding('utf8');
      proc.stderr!.on('data', (chunk: string) => {
        text += chunk;
        node.log.push(chunk);
        if (text.includes('listening on')) {
          clearTimeout(timer);
          resolve();
        }
      });
      proc.on('exit', () => {
        clearTimeout(timer);
        reject(new Error(`batond exited: ${text}`));
      });
    });
    try {
      await listening;
    } catch (e) {
      node.kill();
      throw e;
    }
    return node;
  }

  kill(): void {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
    started.delete(this);
  }

  /** The node's `I` answer as a record, or null when it does not answer. */
  info(): Promise<Record<string, string> | null> {
    return new Promise((resolve) => {
      const s = net.connect(this.port, '127.0.0.1');
      let data = '';
      const done = (v: Record<string, string> | null) => {
        s.destroy();
        resolve(v);
      };
      s.setTimeout(1000, () => done(null));
      s.on('error', () => done(null));
      s.on('connect', () => s.write('I\n'));
      s.on('data', (d) => {
        data += d.toString();
        if (data.endsWith('\n')) {
          const out: Record<string, string> = {};
          for (const f of data.trim().split(' ').slice(1)) {
            const eq = f.indexOf('=');
            if (eq > 0) out[f.slice(0, eq)] = f.slice(eq + 1);
          }
          done(out);
        }
      });
    });
  }
}

const started = new Set<Node>();
/** Kill every node a test started (call from after()). */
export function killAll(): void {
  for (const n of [...started]) n.kill();
}

process.on('exit', killAll);

/** Flags for cluster nodes: a cluster key when batond knows it, else --insecure-peers. */
export function clusterFlags(dir: string): string[] {
  if (hasFlag('--insecure-peers')) return ['--insecure-peers'];
  const key = join(dir, 'cluster.key');
  writeFileSync(key, 'k'.repeat(48) + '\n', { mode: 0o600 });
  return ['--cluster-key-file', key];
}

/** A 2-node cluster: node 0 active, node 1 its synced standby. */
export async function startPair(): Promise<[Node, Node]> {
  const ports = [await freePort(), await freePort()];
  while (ports[1] === ports[0]) ports[1] = await freePort();
  const peers = ports.map((p) => `127.0.0.1:${p}`).join(',');
  const flags = ['--peers', peers, '--detect', '0.5', ...clusterFlags(tmpDir())];
  const a = await Node.start(flags, ports[0]);
  const b = await Node.start(flags, ports[1]);
  await waitFor('node 0 active with a synced standby', async () => {
    const info = await a.info();
    return info !== null && info['state'] === 'active' && info['standbys'] === '1';
  });
  return [a, b];
}

// --- a scripted fake server --------------------------------------------------------

export interface FakeConn {
  index: number;
  socket: net.Socket;
  lines: string[];
  send(line: string): void;
}

/** A server that hands every line to `script`, which answers as it likes. */
export class FakeServer {
  readonly conns: FakeConn[] = [];
  /** Every line received, with the index of its connection, in order. */
  readonly seen: { conn: number; line: string; at: number }[] = [];
  private server!: net.Server;
  port = 0;
  private readonly waiters: (() => void)[] = [];

  constructor(private readonly script: (conn: FakeConn, line: string, server: FakeServer) => void) {}

  get addr(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(port = 0): Promise<this> {
    this.server = net.createServer((socket) => {
      const conn: FakeConn = {
        index: this.conns.length,
        socket,
        lines: [],
        send: (line) => {
          if (!socket.destroyed) socket.write(line + '\n');
        },
      };
      this.conns.push(conn);
      socket.on('error', () => {});
      let buf = '';
      socket.on('data', (d) => {
        buf += d.toString('utf8');
        let nl: number;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          conn.lines.push(line);
          this.seen.push({ conn: conn.index, line, at: performance.now() });
          this.script(conn, line, this);
          for (const w of this.waiters.splice(0)) w();
        }
      });
    });
    await new Promise<void>((resolve) => this.server.listen(port, '127.0.0.1', resolve));
    this.port = (this.server.address() as net.AddressInfo).port;
    return this;
  }

  /** Wait until `check` holds over what was seen. */
  async waitSeen(what: string, check: () => boolean): Promise<void> {
    await waitFor(what, check);
  }

  async close(): Promise<void> {
    for (const c of this.conns) c.socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
