package dev.baton;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The wire format of baton, version 1: checking arguments before anything
 * is sent, formatting request lines, parsing answer lines. Pure functions.
 * Never does I/O, or trust a line from the network: a line that does not
 * parse is reported and the connection that read it is closed.
 */
final class Wire {
    private Wire() {}

    static final int MAX_LINE = 1024;
    static final int MAX_KEY = 250;
    static final int MAX_LIMIT = 10000;
    static final int MAX_VALUE = 250;

    /** A request: its op, its key (null for I), its line, and whether it waits in line. */
    record Request(char op, String key, byte[] line, long waitMs) {
        /** The time a connection has to answer it; -1: no limit (an acquire waiting without limit). */
        long budgetMs(long requestTimeoutMs) {
            if (op == 'A') {
                return waitMs == 0 ? -1 : waitMs + requestTimeoutMs;
            }
            return requestTimeoutMs;
        }
    }

    /** An answer line, parsed. Fields unused by a tag are 0 / null. */
    static final class Answer {
        char tag;
        long token;
        String key;
        int slot = -1;
        long msLeft;
        long waiting;
        long holders;
        String value;
        String active;
        char op;
        String reason;
        String text;
        Map<String, String> info;

        /** The op of the request this answers ('\0' for a fatal E - -). */
        char routeOp() {
            switch (tag) {
                case 'A': case 'T': return 'A';
                case 'R': case 'N': return 'R';
                case 'K': case 'Q': case 'W': case 'X': case 'I': case 'U': return tag;
                case 'M': case 'E': return op;
                default: return 0;
            }
        }

        @Override
        public String toString() {
            return text;
        }
    }

    // ---- checks (before anything is sent) ----

    static String checkKey(String key) {
        if (key == null) {
            throw new BatonArgumentException("a key is 1 to 250 bytes, no spaces or control characters; got null");
        }
        if (!isKeyBytes(key.getBytes(StandardCharsets.UTF_8), MAX_KEY)) {
            throw new BatonArgumentException("bad key '" + key + "': 1 to 250 bytes, no spaces or control characters");
        }
        return key;
    }

    static boolean isKeyBytes(byte[] b, int max) {
        if (b.length < 1 || b.length > max) {
            return false;
        }
        for (byte x : b) {
            int u = x & 0xff;
            if (u <= 0x20 || u == 0x7f) {
                return false;
            }
        }
        return true;
    }

    static long checkLease(Duration lease) {
        if (lease == null || lease.isNegative() || lease.isZero()) {
            throw new BatonArgumentException("the lease must be above 0, got " + lease);
        }
        // No upper bound here: the server's --max-lease decides (lease-too-long).
        return millisCeil(lease);
    }

    /** The wire's wait in ms for a wait asked for: null waits without limit (0 on the wire), ZERO is the shortest, 1 ms. */
    static long checkWait(Duration wait) {
        if (wait == null) {
            return 0;
        }
        if (wait.isNegative()) {
            throw new BatonArgumentException("the wait must be 0 or more (null: without limit), got " + wait);
        }
        return Math.max(1, millisCeil(wait));
    }

    static void checkLimit(Integer limit) {
        if (limit != null && (limit < 1 || limit > MAX_LIMIT)) {
            throw new BatonArgumentException("bad limit " + limit + ": 1 to " + MAX_LIMIT);
        }
    }

    static void checkValue(String value) {
        if (value != null && (!isKeyBytes(value.getBytes(StandardCharsets.UTF_8), MAX_VALUE) || value.equals("-"))) {
            throw new BatonArgumentException("bad value '" + value
                + "': 1 to 250 bytes, no spaces or control characters, not '-' alone");
        }
    }

    static void checkSecret(String secret) {
        if (secret == null || secret.length() < 16 || secret.length() > 128) {
            throw new BatonArgumentException("the secret must be 16 to 128 bytes of printable ASCII without spaces");
        }
        for (int i = 0; i < secret.length(); i++) {
            char c = secret.charAt(i);
            if (c <= 0x20 || c >= 0x7f) {
                throw new BatonArgumentException("the secret must be 16 to 128 bytes of printable ASCII without spaces");
            }
        }
    }

    /** Whole milliseconds in d, rounded up, saturating. */
    static long millisCeil(Duration d) {
        try {
            long ms = d.toMillis();
            if (d.minusMillis(ms).isZero()) {
                return ms;
            }
            return ms + 1;
        } catch (ArithmeticException e) {
            return Long.MAX_VALUE;
        }
    }

    /** Normalised server addresses: host:port (port 7373 by default), trimmed, duplicates dropped. */
    static java.util.List<String> parseServers(java.util.Collection<String> servers) {
        if (servers == null || servers.isEmpty()) {
            throw new BatonArgumentException("no server address given");
        }
        if (servers.size() > Pool.MAX_SERVERS) {
            throw new BatonArgumentException(servers.size() + " servers given; at most " + Pool.MAX_SERVERS);
        }
        java.util.List<String> out = new java.util.ArrayList<>();
        for (String s : servers) {
            String addr = normalise(s == null ? "" : s.trim());
            if (!out.contains(addr)) {
                out.add(addr);
            }
        }
        return out;
    }

    static String normalise(String server) {
        BatonArgumentException bad = new BatonArgumentException("'" + server + "' is not host:port");
        if (server.isEmpty() || server.chars().anyMatch(Character::isWhitespace)) {
            throw bad;
        }
        String host;
        String port;
        if (server.startsWith("[")) {
            int close = server.indexOf(']');
            if (close < 0) {
                throw bad;
            }
            host = server.substring(1, close);
            String after = server.substring(close + 1);
            if (after.isEmpty()) {
                port = null;
            } else if (after.startsWith(":")) {
                port = after.substring(1);
            } else {
                throw bad;
            }
        } else {
            int colon = server.indexOf(':');
            host = colon < 0 ? server : server.substring(0, colon);
            port = colon < 0 ? null : server.substring(colon + 1);
        }
        if (host.isEmpty()) {
            throw bad;
        }
        if (port == null) {
            return server + ":7373";
        }
        try {
            int p = Integer.parseInt(port);
            if (p < 0 || p > 65535 || !port.chars().allMatch(Character::isDigit)) {
                throw bad;
            }
        } catch (NumberFormatException e) {
            throw bad;
        }
        return server;
    }

    // ---- request lines ----

    static String seconds(long ms) {
        long frac = ms % 1000;
        return (ms / 1000) + "." + (frac < 10 ? "00" : frac < 100 ? "0" : "") + frac;
    }

    static Request acquire(String key, long leaseMs, long waitMs, Integer limit, String value) {
        StringBuilder b = new StringBuilder(key.length() + 40);
        b.append("A ").append(key).append(' ').append(seconds(leaseMs)).append(' ').append(seconds(waitMs));
        if (limit != null || value != null) {
            b.append(' ').append(limit == null ? 1 : limit);
        }
        if (value != null) {
            b.append(' ').append(value);
        }
        return new Request('A', key, line(b), waitMs);
    }

    static Request release(String key, long token) {
        return new Request('R', key, line(new StringBuilder("R ").append(key).append(' ').append(Long.toUnsignedString(token))), 0);
    }

    static Request keep(String key, long token, long leaseMs) {
        return new Request('K', key, line(new StringBuilder("K ").append(key).append(' ')
            .append(Long.toUnsignedString(token)).append(' ').append(seconds(leaseMs))), 0);
    }

    static Request query(String key) {
        return new Request('Q', key, line(new StringBuilder("Q ").append(key)), 0);
    }

    static Request info() {
        return new Request('I', null, "I\n".getBytes(StandardCharsets.US_ASCII), 0);
    }

    static byte[] watchLine(String key) {
        return line(new StringBuilder("W ").append(key));
    }

    static byte[] unwatchLine(String key) {
        return line(new StringBuilder("X ").append(key));
    }

    static byte[] authLine(String secret) {
        return line(new StringBuilder("U ").append(secret));
    }

    private static byte[] line(StringBuilder b) {
        return b.append('\n').toString().getBytes(StandardCharsets.UTF_8);
    }

    // ---- answers ----

    /** Thrown for a line that does not parse. */
    static final class WireError extends Exception {
        private static final long serialVersionUID = 1L;

        WireError(String message) {
            super(message, null, false, false);
        }
    }

    static long u64(String f) throws WireError {
        if (f.isEmpty() || f.length() > 20) {
            throw new WireError("not a number: " + f);
        }
        for (int i = 0; i < f.length(); i++) {
            char c = f.charAt(i);
            if (c < '0' || c > '9') {
                throw new WireError("not a number: " + f);
            }
        }
        try {
            return Long.parseUnsignedLong(f);
        } catch (NumberFormatException e) {
            throw new WireError("number out of range: " + f);
        }
    }

    private static String key(String f) throws WireError {
        if (!isKeyBytes(f.getBytes(StandardCharsets.UTF_8), MAX_KEY)) {
            throw new WireError("bad key in an answer");
        }
        return f;
    }

    private static char op(String f) throws WireError {
        if (f.equals("-")) {
            return 0;
        }
        if (f.length() == 1 && "ARKQIUWX".indexOf(f.charAt(0)) >= 0) {
            return f.charAt(0);
        }
        throw new WireError("unknown op " + f);
    }

    /** Parse one answer line, without its line ending ('\r' before it is dropped). */
    static Answer parse(String line) throws WireError {
        if (line.endsWith("\r")) {
            line = line.substring(0, line.length() - 1);
        }
        String[] f = line.split(" ", -1);
        for (int i = 1; i < f.length; i++) {
            if (f[i].isEmpty()) {
                throw new WireError("empty field in " + abbreviate(line));
            }
        }
        int n = f.length - 1;
        Answer a = new Answer();
        a.text = line;
        String tag = f[0];
        if (tag.length() != 1) {
            throw new WireError("an answer that does not parse: " + abbreviate(line));
        }
        a.tag = tag.charAt(0);
        switch (a.tag) {
            case 'A':
                if (n == 2 || n == 3) {
                    a.token = u64(f[1]);
                    a.key = key(f[2]);
                    if (n == 3) {
                        long slot = u64(f[3]);
                        if (slot >= MAX_LIMIT) {
                            throw new WireError("slot out of range: " + f[3]);
                        }
                        a.slot = (int) slot;
                    }
                    return a;
                }
                break;
            case 'W':
                if (n == 5) {
                    a.key = key(f[1]);
                    a.token = u64(f[2]);
                    a.holders = u64(f[3]);
                    a.waiting = u64(f[4]);
                    a.value = f[5].equals("-") ? null : key(f[5]);
                    return a;
                }
                break;
            case 'T': case 'R': case 'N': case 'K': case 'X':
                if (n == 1) {
                    a.key = key(f[1]);
                    return a;
                }
                break;
            case 'Q':
                if (n == 4) {
                    a.key = key(f[1]);
                    a.token = u64(f[2]);
                    a.msLeft = u64(f[3]);
                    a.waiting = u64(f[4]);
                    return a;
                }
                break;
            case 'M':
                if (n == 3) {
                    a.active = f[1].equals("-") ? null : f[1];
                    a.op = op(f[2]);
                    a.key = f[3].equals("-") ? null : key(f[3]);
                    if (a.op == 0) {
                        throw new WireError("M without an op");
                    }
                    return a;
                }
                break;
            case 'E':
                if (n == 3) {
                    a.op = op(f[1]);
                    a.key = f[2].equals("-") ? null : key(f[2]);
                    a.reason = f[3];
                    return a;
                }
                break;
            case 'I':
                a.info = new LinkedHashMap<>();
                for (int i = 1; i < f.length; i++) {
                    int eq = f[i].indexOf('=');
                    if (eq < 0) {
                        throw new WireError("info field without '='");
                    }
                    a.info.put(f[i].substring(0, eq), f[i].substring(eq + 1));
                }
                return a;
            case 'U':
                if (n == 1) {
                    a.reason = f[1];
                    return a;
                }
                break;
            default:
                break;
        }
        throw new WireError("an answer that does not parse: " + abbreviate(line));
    }

    static String abbreviate(String line) {
        return line.length() > 80 ? line.substring(0, 80) + "..." : line;
    }
}
