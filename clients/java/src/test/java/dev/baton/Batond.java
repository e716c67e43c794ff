package dev.baton;

import java.io.File;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/** A batond process for a test: started on a free 127.0.0.1 port, stopped (by PID) by close(). */
final class Batond implements AutoCloseable {
    final int port;
    final String addr;
    private final List<String> extra;
    private Process process;
    private final Path log;

    private Batond(int port, List<String> extra) throws IOException {
        this.port = port;
        this.addr = "127.0.0.1:" + port;
        this.extra = extra;
        this.log = Files.createTempFile("batond-" + port + "-", ".log");
    }

    static String binary() {
        String env = System.getenv("BATON_BATOND");
        if (env != null && !env.isEmpty()) {
            return env;
        }
        File root = new File(System.getProperty("user.dir")).getAbsoluteFile();
        // clients/java -> the repository root
        File repo = root.getParentFile() == null ? root : root.getParentFile().getParentFile();
        return new File(repo, "target/release/batond").getPath();
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            return s.getLocalPort();
        }
    }

    static Batond start(String... extra) throws IOException, InterruptedException {
        Batond b = new Batond(freePort(), List.of(extra));
        b.launch();
        return b;
    }

    /** A node of a cluster: its port chosen already. */
    static Batond node(int port, String... extra) throws IOException {
        return new Batond(port, List.of(extra));
    }

    void launch() throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>(List.of(binary(), "--bind", "127.0.0.1", "--port", String.valueOf(port)));
        cmd.addAll(extra);
        process = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile()).start();
        long end = System.nanoTime() + 10_000_000_000L;
        while (System.nanoTime() < end) {
            if (!process.isAlive()) {
                throw new IOException("batond exited: " + Files.readString(log));
            }
            try (Socket s = new Socket()) {
                s.connect(new InetSocketAddress("127.0.0.1", port), 200);
                return;
            } catch (IOException e) {
                Thread.sleep(20);
            }
        }
        throw new IOException("batond did not listen on " + port);
    }

    void kill() throws InterruptedException {
        if (process != null && process.isAlive()) {
            process.destroyForcibly();
            process.waitFor();
        }
    }

    @Override
    public void close() throws InterruptedException {
        kill();
        try {
            Files.deleteIfExists(log);
        } catch (IOException ignored) {
            // a temp file
        }
    }
}
