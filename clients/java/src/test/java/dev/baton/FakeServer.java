package dev.baton;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A scripted node in the test's own process: accepts connections on a free
 * 127.0.0.1 port and hands each line it reads to the test's script, which
 * answers (or drops the connection) as a misbehaving node would.
 */
final class FakeServer implements AutoCloseable {
    /** One accepted connection. */
    final class Link {
        final int index;
        final Socket socket;
        private final OutputStream out;

        Link(int index, Socket socket) throws IOException {
            this.index = index;
            this.socket = socket;
            this.out = socket.getOutputStream();
        }

        synchronized void send(String line) {
            try {
                out.write((line + "\n").getBytes(StandardCharsets.UTF_8));
                out.flush();
            } catch (IOException ignored) {
                // the client went away
            }
        }

        void drop() {
            try {
                socket.close();
            } catch (IOException ignored) {
                // closing anyway
            }
        }
    }

    /** What the script is given: a line read on a link. */
    record Line(Link link, String text) {}

    /** The script: answer a line. */
    interface Script {
        void on(Line line);
    }

    final ServerSocket server;
    final String addr;
    final List<Link> links = new CopyOnWriteArrayList<>();
    final LinkedBlockingQueue<Line> seen = new LinkedBlockingQueue<>();
    private volatile Script script;
    private final Thread acceptor;

    FakeServer(Script script) throws IOException {
        this.script = script;
        this.server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        this.addr = "127.0.0.1:" + server.getLocalPort();
        acceptor = new Thread(this::accept, "fake-accept");
        acceptor.setDaemon(true);
        acceptor.start();
    }

    void script(Script s) {
        this.script = s;
    }

    private void accept() {
        while (!server.isClosed()) {
            try {
                Socket s = server.accept();
                Link link = new Link(links.size(), s);
                links.add(link);
                Thread t = new Thread(() -> read(link), "fake-link");
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                return;
            }
        }
    }

    private void read(Link link) {
        try (BufferedReader r = new BufferedReader(new InputStreamReader(link.socket.getInputStream(),
            StandardCharsets.UTF_8))) {
            String line;
            while ((line = r.readLine()) != null) {
                Line l = new Line(link, line);
                seen.add(l);
                script.on(l);
            }
        } catch (IOException ignored) {
            // dropped
        }
    }

    /** The next line the clients sent that starts with {@code prefix}, within 10 s. */
    Line next(String prefix) throws InterruptedException {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (true) {
            Line l = seen.poll(Math.max(1, end - System.nanoTime()), TimeUnit.NANOSECONDS);
            if (l == null) {
                throw new AssertionError("no line starting with '" + prefix + "' came");
            }
            if (l.text().startsWith(prefix)) {
                return l;
            }
        }
    }

    /** Waits (bounded) until {@code n} connections were accepted. */
    void awaitLinks(int n) throws InterruptedException {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (links.size() < n) {
            if (System.nanoTime() > end) {
                throw new AssertionError("only " + links.size() + " connections came");
            }
            Thread.sleep(5);
        }
    }

    /** A plain answering script: grants every A with token 7, releases every R, keeps every K. */
    static void plain(Line l) {
        String[] f = l.text().split(" ");
        switch (f[0]) {
            case "A":
                l.link().send("A 7 " + f[1]);
                break;
            case "R":
                l.link().send("R " + f[1]);
                break;
            case "K":
                l.link().send("K " + f[1]);
                break;
            case "Q":
                l.link().send("Q " + f[1] + " 0 0 0");
                break;
            case "I":
                l.link().send("I role=active");
                break;
            default:
                break;
        }
    }

    @Override
    public void close() throws IOException {
        server.close();
        for (Link l : links) {
            l.drop();
        }
    }
}
