// Requests waiting for their answer on one connection, per (op, key), in
// the order they were sent. The server answers requests with the same
// (op, key) on one connection in arrival order, so the oldest waiting
// request of that (op, key) is the one an answer belongs to, and only that
// one can be answered next: the server holds back the answer to a later
// acquire of a key (even a T whose wait ran out) until the earlier one on
// the same connection is answered. `push` says whether a request went to
// the front of its line, `front` names the one there, and `has` lets the
// pool send an acquire to a connection with none of its key outstanding.
// Pure: no I/O.

export class Pending<T> {
  private readonly queues = new Map<string, T[]>();
  private count = 0;

  private static id(op: string, key: string): string {
    return op + ' ' + key;
  }

  /** Remember a request just sent, behind those with the same (op, key);
   * true when none was waiting (it is at the front of its line). */
  push(op: string, key: string, slot: T): boolean {
    const id = Pending.id(op, key);
    const queue = this.queues.get(id);
    this.count++;
    if (queue === undefined) {
      this.queues.set(id, [slot]);
      return true;
    }
    queue.push(slot);
    return false;
  }

  /** A request with this (op, key) waits for its answer (one map lookup). */
  has(op: string, key: string): boolean {
    return this.queues.has(Pending.id(op, key));
  }

  /** The oldest waiting request with this (op, key), left in place. */
  front(op: string, key: string): { slot: T } | undefined {
    const queue = this.queues.get(Pending.id(op, key));
    return queue === undefined ? undefined : { slot: queue[0] as T };
  }

  /** The oldest waiting request with this (op, key), removed; undefined
   * when none waits (the connection is then out of step). */
  take(op: string, key: string): { slot: T } | undefined {
    const id = Pending.id(op, key);
    const queue = this.queues.get(id);
    if (queue === undefined) return undefined;
    const slot = queue.shift() as T;
    if (queue.length === 0) this.queues.delete(id);
    this.count--;
    return { slot };
  }

  /** A request of `op` (any key) waits for its answer (a scan of the
   * lines: for closing, not for every call). */
  hasOp(op: string): boolean {
    for (const id of this.queues.keys()) if (id.startsWith(op + ' ')) return true;
    return false;
  }

  /** Every waiting request, left in place. */
  slots(): T[] {
    const all: T[] = [];
    for (const queue of this.queues.values()) all.push(...queue);
    return all;
  }

  get size(): number {
    return this.count;
  }

  /** Every waiting request, removed (the connection is gone). */
  drain(): T[] {
    const all: T[] = [];
    for (const queue of this.queues.values()) all.push(...queue);
    this.queues.clear();
    this.count = 0;
    return all;
  }
}
