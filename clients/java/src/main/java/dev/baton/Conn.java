package dev.baton;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/**
 * One connection to one server, kept up by its own thread ("baton-conn
 * host:port"), which connects (TLS and {@code U} first when configured),
 * reads and dispatches every answer, probes a silent server with {@code I},
 * and reconnects every 3 s after a drop. Callers write their request lines
 * themselves, under the write lock, in the order they push them into the
 * pending table, so answers are matched by (op, key) in send order. A
 * request sent behind an earlier one of its (op, key) (an acquire behind an
 * acquire of the same key waiting in line) cannot be answered before it,
 * even when its own wait has run out: its ticket says when it reached the
 * front of that line ({@link Ticket#atFront}), and the overdue clock of the
 * call (Calls) runs only from then.
 * Never does: retry, choose, or interpret answers beyond routing them.
 */
final class Conn {
    enum Phase { CONNECTING, UP, DOWN }

    static final long RECONNECT_MS = 3000;
    static final int MAX_IN_FLIGHT = 65536;

    /** Completes a ticket whose connection dropped. */
    static final class ConnLost extends RuntimeException {
        private static final long serialVersionUID = 1L;

        ConnLost() {
            super("the connection dropped", null, false, false);
        }
    }

    static final ConnLost LOST = new ConnLost();

    /** One request sent, waiting for its answer. */
    static final class Ticket {
        final Conn conn;
        final long generation;
        final long sentAt = System.nanoTime();
        final CompletableFuture<Wire.Answer> future = new CompletableFuture<>();
        /** When the request reached the front of its (op, key) line here; valid once {@link #atFront}. */
        private volatile long frontAt;
        private volatile boolean atFront;

        Ticket(Conn conn, long generation) {
            this.conn = conn;
            this.generation = generation;
        }

        /** The request was sent at the front of its line: it can be answered from its send on. */
        void sentAtFront() {
            frontAt = sentAt;
            atFront = true;
        }

        /** The request can be answered from now on: none before it of its (op, key) is unanswered. */
        void reachedFront() {
            if (!atFront) {
                frontAt = System.nanoTime();
                atFront = true;
            }
        }

        /** True once the request reached the front of its line (else the server may hold its answer back). */
        boolean atFront() {
            return atFront;
        }

        /** When it reached the front of its line; only once {@link #atFront}. */
        long frontAt() {
            return frontAt;
        }
    }

    /** One watch's subscription on this connection. */
    record Sub(Watch watch, long epoch) {}

    private static final class Watchers {
        final ArrayDeque<Sub> awaiting = new ArrayDeque<>(); // entries may be NO_SUB (given up)
        final List<Sub> live = new ArrayList<>();

        boolean noneLeft() {
            if (!live.isEmpty()) {
                return false;
            }
            for (Sub s : awaiting) {
                if (s != NO_SUB) {
                    return false;
                }
            }
            return true;
        }

        List<Sub> every() {
            List<Sub> all = new ArrayList<>(live);
            for (Sub s : awaiting) {
                if (s != NO_SUB) {
                    all.add(s);
                }
            }
            return all;
        }
    }

    private static final Sub NO_SUB = new Sub(null, -1);

    final int node;
    final String addr;
    private final Pool pool;
    private final Object state = new Object();
    private Thread thread;

    // Under `state`:
    private Phase phase = Phase.CONNECTING;
    private long generation;
    private Socket socket;
    private OutputStream out;
    private final Pending<Ticket> pending = new Pending<>();
    private final java.io.ByteArrayOutputStream outbox = new java.io.ByteArrayOutputStream(4096);
    private boolean flushing;
    private final Map<String, Watchers> watches = new HashMap<>();
    private String lastError;
    private String killReason;
    private String authRefused;

    Conn(Pool pool, int node, String addr) {
        this.pool = pool;
        this.node = node;
        this.addr = addr;
    }

    void start() {
        thread = new Thread(this::run, "baton-conn " + addr);
        thread.setDaemon(true);
        thread.start();
    }

    Thread thread() {
        return thread;
    }

    Phase phase() {
        synchronized (state) {
            return phase;
        }
    }

    String lastError() {
        synchronized (state) {
            return lastError;
        }
    }

    /** True when a request with this (op, key) waits for its answer here (a later one would be answered after it). */
    boolean hasPending(char op, String key) {
        synchronized (state) {
            return pending.has(op, key);
        }
    }

    /** The reason word when the server refused this client's secret on the last attempt. */
    String authRefused() {
        synchronized (state) {
            return authRefused;
        }
    }

    /** Send a request whose answer the caller waits for; null when the connection is not up. */
    Ticket send(Wire.Request request) {
        return send(request.op(), request.key(), request.line(), true);
    }

    private Ticket send(char op, String key, byte[] line, boolean wanted) {
        return enqueue(op, key, line, wanted, null, 0, true);
    }

    /**
     * Append a line to the outbox under the state lock (so pending order is
     * send order) and write the outbox unless another thread is writing it
     * now: concurrent callers' lines go out together in one write.
     */
    private Ticket enqueue(char op, String key, byte[] line, boolean wanted, Watch watch, long epoch,
                           boolean flushHere) {
        Ticket ticket;
        synchronized (state) {
            if (phase != Phase.UP || out == null || pending.size() >= MAX_IN_FLIGHT) {
                return null;
            }
            if (watch != null) {
                watches.computeIfAbsent(key, k -> new Watchers()).awaiting.addLast(new Sub(watch, epoch));
                ticket = new Ticket(this, generation);
            } else {
                ticket = new Ticket(this, wanted ? generation : -1);
                if (pending.push(op, key, wanted ? ticket : null)) {
                    // Not the time now: the first push of a JVM can take
                    // tens of milliseconds (a record's first hashCode), and
                    // the connection's deadline must not drift past the
                    // caller's (see Calls.pastDeadline).
                    ticket.sentAtFront();
                }
            }
            outbox.write(line, 0, line.length);
            if (flushing) {
                return ticket;
            }
            flushing = true;
        }
        if (flushHere) {
            flush();
        } else if (pool.schedule(this::flush, 0) == null) {
            shut();
        }
        return ticket;
    }

    /** Write the outbox until it is empty (only the thread that set `flushing`). */
    private void flush() {
        while (true) {
            byte[] data;
            OutputStream o;
            synchronized (state) {
                if (outbox.size() == 0 || out == null) {
                    outbox.reset();
                    flushing = false;
                    return;
                }
                data = outbox.toByteArray();
                outbox.reset();
                o = out;
            }
            try {
                o.write(data);
                o.flush();
            } catch (IOException e) {
                synchronized (state) {
                    outbox.reset();
                    flushing = false;
                }
                shut(); // the reader sees the socket end and fails the pending requests
                return;
            }
        }
    }

    /** Subscribe a watch: send {@code W key}; the generation it went out on, or -1 when not up. */
    long watch(String key, Watch watch, long epoch) {
        Ticket t = enqueue('W', key, Wire.watchLine(key), false, watch, epoch, true);
        return t == null ? -1 : t.generation;
    }

    /** Give a subscription up; {@code X key} goes out when it was the key's last on this connection. */
    void unwatch(String key, long gen, Watch watch, long epoch) {
        boolean sendX;
        synchronized (state) {
            if (generation != gen || phase != Phase.UP) {
                return;
            }
            Watchers w = watches.get(key);
            if (w == null) {
                return;
            }
            for (Iterator<Sub> it = w.awaiting.iterator(); it.hasNext();) {
                Sub s = it.next();
                if (s.watch() == watch && s.epoch() == epoch) {
                    // Keep its place: the W line still comes and must be matched.
                    ArrayDeque<Sub> copy = new ArrayDeque<>();
                    for (Sub t : w.awaiting) {
                        copy.addLast(t == s ? NO_SUB : t);
                    }
                    w.awaiting.clear();
                    w.awaiting.addAll(copy);
                    break;
                }
            }
            w.live.removeIf(s -> s.watch() == watch && s.epoch() == epoch);
            sendX = w.noneLeft();
            if (sendX && w.awaiting.isEmpty()) {
                watches.remove(key);
            }
        }
        if (sendX) {
            send('X', key, Wire.unwatchLine(key), false);
        }
    }

    /** Close this connection (it reconnects) if it is still the one of generation {@code gen}. */
    void kill(long gen, String why) {
        synchronized (state) {
            if (generation != gen || phase != Phase.UP) {
                return;
            }
            killReason = why;
        }
        shut();
    }

    /** Close the socket now (the client is closing, or a write failed). */
    void shut() {
        Socket s;
        synchronized (state) {
            s = socket;
        }
        if (s != null) {
            try {
                s.close();
            } catch (IOException ignored) {
                // closing anyway
            }
        }
    }

    // ---- the connection's thread ----

    private void run() {
        try {
            while (!pool.isClosed()) {
                setPhase(Phase.CONNECTING, null);
                Socket s;
                try {
                    s = open();
                } catch (IOException e) {
                    setPhase(Phase.DOWN, plain(e));
                    if (pool.sleepReconnect(RECONNECT_MS)) {
                        break;
                    }
                    continue;
                }
                serve(s);
                if (pool.sleepReconnect(RECONNECT_MS)) {
                    break;
                }
            }
        } catch (RuntimeException | Error e) {
            System.err.println("baton: connection thread " + addr + " failed: " + e);
        } finally {
            setPhase(Phase.DOWN, "the client is closed");
        }
    }

    private String host() {
        int colon = addr.lastIndexOf(':');
        String host = addr.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        return host;
    }

    private Socket open() throws IOException {
        int colon = addr.lastIndexOf(':');
        int port = Integer.parseInt(addr.substring(colon + 1));
        String host = host();
        Socket raw = new Socket();
        synchronized (state) {
            socket = raw; // so that close() can interrupt a connect
        }
        try {
            raw.setTcpNoDelay(true);
            raw.connect(new InetSocketAddress(host, port), (int) pool.connectTimeoutMs);
            if (pool.tls == null) {
                return raw;
            }
            SSLSocket ssl = (SSLSocket) pool.tls.getSocketFactory().createSocket(raw, host, port, true);
            SSLParameters params = ssl.getSSLParameters();
            params.setEndpointIdentificationAlgorithm("HTTPS");
            ssl.setSSLParameters(params);
            ssl.setSoTimeout((int) pool.connectTimeoutMs);
            synchronized (state) {
                socket = ssl;
            }
            ssl.startHandshake();
            return ssl;
        } catch (IOException | RuntimeException e) {
            try {
                raw.close();
            } catch (IOException ignored) {
                // failed anyway
            }
            synchronized (state) {
                socket = null;
            }
            if (pool.isClosed()) {
                throw new IOException("the client is closed");
            }
            throw e instanceof IOException ? (IOException) e : new IOException(e.getMessage(), e);
        }
    }

    private void serve(Socket s) {
        LineReader reader;
        OutputStream o;
        try {
            reader = new LineReader(s.getInputStream());
            o = s.getOutputStream();
            if (pool.secret != null) {
                String refused = authenticate(s, reader, o);
                if (refused != null) {
                    close(s);
                    setPhase(Phase.DOWN, refused);
                    return;
                }
            }
            s.setSoTimeout((int) pool.requestTimeoutMs);
        } catch (IOException e) {
            close(s);
            setPhase(Phase.DOWN, plain(e));
            return;
        }
        synchronized (state) {
            phase = Phase.UP;
            generation++;
            socket = s;
            out = o;
            lastError = null;
            killReason = null;
            authRefused = null;
        }
        pool.bump();
        if (pool.isClosed()) {
            close(s);
        }
        String why = readLoop(reader);
        goDown(why);
    }

    /** Null when the connection may be used, else why not. */
    private String authenticate(Socket s, LineReader reader, OutputStream o) throws IOException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(pool.connectTimeoutMs);
        o.write(Wire.authLine(pool.secret));
        o.flush();
        while (true) {
            long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            if (left <= 0) {
                return "no answer to U within " + pool.connectTimeoutMs + " ms";
            }
            s.setSoTimeout((int) Math.max(1, left));
            String line;
            try {
                line = reader.readLine();
            } catch (SocketTimeoutException e) {
                continue;
            }
            if (line == null) {
                return "closed by the server while authenticating";
            }
            if (line.isEmpty() || line.equals("\r")) {
                continue;
            }
            Wire.Answer a;
            try {
                a = Wire.parse(line);
            } catch (Wire.WireError e) {
                return "the server's answer to U makes no sense";
            }
            if (a.tag == 'U' && "ok".equals(a.reason)) {
                return null;
            }
            if (a.tag == 'E' && a.op == 'U' && "auth-disabled".equals(a.reason)) {
                return null;
            }
            if (a.tag == 'E' && a.op == 0) {
                if ("bad-auth".equals(a.reason) || "auth-required".equals(a.reason)) {
                    synchronized (state) {
                        authRefused = a.reason;
                    }
                    return "the server refused the secret: " + a.reason;
                }
                return "refused by the server: " + a.reason;
            }
            return "the server's answer to U makes no sense";
        }
    }

    private String readLoop(LineReader reader) {
        boolean probing = false;
        while (true) {
            String line;
            try {
                line = reader.readLine();
            } catch (SocketTimeoutException e) {
                if (pool.isClosed()) {
                    return "the client is closed";
                }
                if (probing) {
                    return "no answer to a probe within " + pool.requestTimeoutMs + " ms";
                }
                probing = probe();
                continue;
            } catch (LineReader.TooLong e) {
                return "the server sent a line longer than " + Wire.MAX_LINE + " bytes";
            } catch (IOException e) {
                return plain(e);
            }
            if (line == null) {
                return "closed by the server";
            }
            probing = false;
            if (line.isEmpty() || line.equals("\r")) {
                continue;
            }
            Wire.Answer a;
            try {
                a = Wire.parse(line);
            } catch (Wire.WireError e) {
                return "the server sent a line that does not parse";
            }
            String why = dispatch(a);
            if (why != null) {
                return why;
            }
        }
    }

    /** The server said nothing for the request timeout: ask it something if we wait for it. */
    private boolean probe() {
        synchronized (state) {
            if (pending.isEmpty() && watches.isEmpty()) {
                return false;
            }
        }
        Wire.Request info = Wire.info();
        // Never written from this thread: a write stuck on a full socket would stop the reading.
        enqueue(info.op(), null, info.line(), false, null, 0, false);
        return true;
    }

    /** Null, or why the connection must close. */
    String dispatch(Wire.Answer a) {
        List<Sub> to = null;
        Watch.Event event = null;
        if (a.tag == 'W') {
            synchronized (state) {
                Watchers w = watches.get(a.key);
                if (w == null) {
                    return null; // no longer watched
                }
                Sub first = w.awaiting.pollFirst();
                if (first != null && first != NO_SUB) {
                    w.live.add(first);
                }
                to = new ArrayList<>(w.live);
                if (w.awaiting.isEmpty() && w.live.isEmpty()) {
                    watches.remove(a.key);
                }
            }
            event = Watch.Event.state(a);
        } else if (a.tag == 'M' && a.op == 'W' && a.key != null) {
            synchronized (state) {
                Watchers w = watches.remove(a.key);
                to = w == null ? List.of() : w.every();
            }
            event = Watch.Event.moved(a.active);
        } else if (a.tag == 'E' && a.op == 'W' && a.key != null) {
            synchronized (state) {
                Watchers w = watches.get(a.key);
                if (w == null) {
                    return null;
                }
                Sub first = w.awaiting.pollFirst();
                to = first == null || first == NO_SUB ? List.of() : List.of(first);
                if (w.awaiting.isEmpty() && w.live.isEmpty()) {
                    watches.remove(a.key);
                }
            }
            event = Watch.Event.refused(a.reason);
        }
        if (event != null) {
            for (Sub s : to) {
                s.watch().onEvent(s.epoch(), event);
            }
            return null;
        }
        char op = a.routeOp();
        if (op == 0) {
            if ("bad-auth".equals(a.reason) || "auth-required".equals(a.reason)) {
                synchronized (state) {
                    authRefused = a.reason;
                }
                return "the server refused the secret: " + a.reason;
            }
            return "refused by the server: " + a.reason;
        }
        Object[] slot = new Object[1];
        boolean found;
        String key = op == 'I' || op == 'U' ? null : a.key;
        boolean taken = false;
        synchronized (state) {
            found = pending.take(op, key, slot);
            Ticket next = found ? pending.front(op, key) : null;
            if (next != null) {
                next.reachedFront();
            }
            if (found && slot[0] != null && a.tag == 'A' && !pool.takeInHand()) {
                // Close ends the call: the grant goes to nobody. Its release
                // is pending here before the lock is let go, so that settle
                // never finds this connection with neither the acquire nor
                // the release outstanding.
                taken = true;
                releaseOrphan(a);
            }
        }
        if (!found) {
            return "the server sent an answer for no request: " + Wire.abbreviate(a.text);
        }
        Ticket t = (Ticket) slot[0];
        if (taken) {
            t.future.completeExceptionally(new ClosedException("the client is closed"));
        } else if (t != null && !t.future.complete(a)) {
            releaseOrphan(a);
            if (a.tag == 'A') {
                pool.handOut(); // it was counted in hand: its release is pending now
            }
        }
        return null;
    }

    /**
     * The client is closing, and a grant reaches no caller any more (each is
     * released as it comes: {@link #dispatch}): make sure that every grant
     * the server made to this connection so far has come, and its release
     * has reached the server, so that closing the socket leaves no key held
     * (the release of a key this client held hands it to this client's own
     * waiter here, say). Two {@code I} round trips, when an acquire (or the
     * release of a grant that came) is outstanding: the server writes a
     * connection's answers in the order of its rounds, so the first
     * {@code I}'s answer comes after every grant made before the {@code I}
     * was read, and the second's after the releases of those grants. Waits
     * until {@code untilNanos} at most.
     */
    void settle(long untilNanos) throws InterruptedException {
        synchronized (state) {
            if (!pending.hasOp('A') && !pending.hasOp('R')) {
                return;
            }
        }
        for (int i = 0; i < 2; i++) {
            Ticket t = send(Wire.info());
            if (t == null) {
                return;
            }
            try {
                t.future.get(Math.max(0, untilNanos - System.nanoTime()), TimeUnit.NANOSECONDS);
            } catch (java.util.concurrent.ExecutionException | java.util.concurrent.TimeoutException e) {
                return; // the connection dropped, or the time is up
            }
        }
    }

    /** A grant whose caller gave up: release it at once. */
    private void releaseOrphan(Wire.Answer a) {
        if (a.tag == 'A') {
            Wire.Request r = Wire.release(a.key, a.token);
            enqueue(r.op(), r.key(), r.line(), false, null, 0, false);
        }
    }

    private void goDown(String why) {
        List<Ticket> waiting;
        List<Sub> subs = new ArrayList<>();
        Socket s;
        synchronized (state) {
            phase = Phase.DOWN;
            out = null;
            s = socket;
            socket = null;
            if (killReason != null) {
                why = killReason;
                killReason = null;
            }
            lastError = why;
            outbox.reset();
            for (Watchers w : watches.values()) {
                subs.addAll(w.every());
            }
            watches.clear();
            waiting = pending.drain();
        }
        close(s);
        pool.bump();
        for (Ticket t : waiting) {
            t.future.completeExceptionally(LOST);
        }
        Watch.Event ended = Watch.Event.ended();
        for (Sub sub : subs) {
            sub.watch().onEvent(sub.epoch(), ended);
        }
    }

    private void setPhase(Phase p, String error) {
        synchronized (state) {
            phase = p;
            if (error != null) {
                lastError = error;
            }
        }
        pool.bump();
    }

    private static void close(Socket s) {
        if (s != null) {
            try {
                s.close();
            } catch (IOException ignored) {
                // closing anyway
            }
        }
    }

    static String plain(Throwable e) {
        String m = e.getMessage();
        if (m == null || m.isEmpty()) {
            return e.getClass().getSimpleName();
        }
        return Character.toLowerCase(m.charAt(0)) + m.substring(1);
    }

    /** Lines from a stream, at most {@link Wire#MAX_LINE} bytes each, kept across read timeouts. */
    static final class LineReader {
        static final class TooLong extends IOException {
            private static final long serialVersionUID = 1L;
        }

        private final InputStream in;
        private final byte[] buf = new byte[16384];
        private int start;
        private int scanned;
        private int end;

        LineReader(InputStream in) {
            this.in = in;
        }

        /** The next line without its '\n'; null at the end of the stream. */
        String readLine() throws IOException {
            while (true) {
                for (int i = scanned; i < end; i++) {
                    if (buf[i] == '\n') {
                        if (i + 1 - start > Wire.MAX_LINE) {
                            throw new TooLong();
                        }
                        String line = new String(buf, start, i - start, StandardCharsets.UTF_8);
                        start = i + 1;
                        scanned = start;
                        return line;
                    }
                }
                scanned = end;
                if (end - start >= Wire.MAX_LINE) {
                    throw new TooLong();
                }
                if (end == buf.length) {
                    System.arraycopy(buf, start, buf, 0, end - start);
                    end -= start;
                    scanned -= start;
                    start = 0;
                }
                int n = in.read(buf, end, buf.length - end);
                if (n < 0) {
                    return null;
                }
                end += n;
            }
        }
    }
}
