// Requests waiting for their answer on one connection, per (op, key), in
// the order they were sent. The server answers requests with the same
// (op, key) on one connection in arrival order, so the oldest waiting
// request of that (op, key) is the one an answer belongs to. Pure: no I/O.

export class Pending<T> {
  private readonly queues = new Map<string, T[]>();
  private count = 0;

  private static id(op: string, key: string): string {
    return op + ' ' + key;
  }

  /** Remember a request just sent, behind those with the same (op, key). */
  push(op: string, key: string, slot: T): void {
    const id = Pending.id(op, key);
    const queue = this.queues.get(id);
    if (queue === undefined) this.queues.set(id, [slot]);
    else queue.push(slot);
    this.count++;
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
