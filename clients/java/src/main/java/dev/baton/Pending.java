package dev.baton;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * Requests waiting for their answer on one connection, per (op, key), oldest
 * first. The server answers requests with the same (op, key) on one
 * connection in arrival order, so the oldest waiting request of that
 * (op, key) is the one an answer belongs to, and only that one can be
 * answered next: the server holds back the answer to a later acquire of a key
 * (even a {@code T} whose wait ran out) until the earlier one on the same
 * connection is answered. {@link #push} says whether a request went to the
 * front of its line, {@link #front} names the one there, {@link #has}
 * lets the pool send an acquire to a connection with none of its key
 * outstanding, and {@link #hasOp} tells a closing client which connections
 * to settle. Pure; the connection locks it.
 *
 * @param <T> what hands the answer over (a ticket; null for a request whose
 *     answer nobody waits for)
 */
final class Pending<T> {
    /** (op, key); key null for I and U. */
    record Id(char op, String key) {}

    private final Map<Id, ArrayDeque<Object>> queues = new HashMap<>();
    private int len;
    private static final Object NONE = new Object();

    /**
     * Remember a request just sent, behind those with the same (op, key).
     *
     * @return true when none was waiting: it is at the front of its line
     */
    boolean push(char op, String key, T slot) {
        ArrayDeque<Object> q = queues.computeIfAbsent(new Id(op, key), k -> new ArrayDeque<>());
        q.addLast(slot == null ? NONE : slot);
        len++;
        return q.size() == 1;
    }

    /** True when a request with this (op, key) waits for its answer (one hash lookup). */
    boolean has(char op, String key) {
        return queues.containsKey(new Id(op, key));
    }

    /** True when a request of {@code op} (any key) waits for its answer (a scan: for closing, not for every call). */
    boolean hasOp(char op) {
        for (Id id : queues.keySet()) {
            if (id.op() == op) {
                return true;
            }
        }
        return false;
    }

    /** The oldest waiting request's slot with this (op, key), left in place; null when none (or nobody waits for it). */
    @SuppressWarnings("unchecked")
    T front(char op, String key) {
        ArrayDeque<Object> q = queues.get(new Id(op, key));
        Object slot = q == null ? null : q.peekFirst();
        return slot == null || slot == NONE ? null : (T) slot;
    }

    /**
     * The oldest waiting request with this (op, key), removed.
     *
     * @return true when one waited; its slot is then in {@code out[0]} (null when nobody waits for its answer)
     */
    @SuppressWarnings("unchecked")
    boolean take(char op, String key, Object[] out) {
        Id id = new Id(op, key);
        ArrayDeque<Object> q = queues.get(id);
        if (q == null || q.isEmpty()) {
            return false;
        }
        Object slot = q.pollFirst();
        if (q.isEmpty()) {
            queues.remove(id);
        }
        len--;
        out[0] = slot == NONE ? null : (T) slot;
        return true;
    }

    int size() {
        return len;
    }

    boolean isEmpty() {
        return len == 0;
    }

    /** Every waiting request's slot (nulls left out), removed: the connection is gone. */
    @SuppressWarnings("unchecked")
    List<T> drain() {
        List<T> all = new ArrayList<>();
        for (ArrayDeque<Object> q : queues.values()) {
            for (Object o : q) {
                if (o != NONE) {
                    all.add((T) Objects.requireNonNull(o));
                }
            }
        }
        queues.clear();
        len = 0;
        return all;
    }
}
