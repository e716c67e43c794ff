package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** The conformance driver, run as CI runs it, against a real batond. */
@Timeout(60)
class DriverTest {
    private static Process driver(boolean async) throws Exception {
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        String classes = Path.of("target", "classes").toAbsolutePath().toString();
        return async
            ? new ProcessBuilder(java, "-cp", classes, "dev.baton.driver.Driver", "--async").start()
            : new ProcessBuilder(java, "-cp", classes, "dev.baton.driver.Driver").start();
    }

    @ParameterizedTest
    @ValueSource(booleans = {false, true})
    void aSessionAndBadInput(boolean async) throws Exception {
        try (Batond node = Batond.start()) {
            Process p = driver(async);
            try {
                OutputStream in = p.getOutputStream();
                BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
                String ready = out.readLine();
                assertEquals("{\"ready\":true,\"client\":\"" + (async ? "java-async" : "java") + "\",\"version\":\"0.1.0\",\"cancel\":true}", ready);
                send(in, "{\"id\":1,\"cmd\":\"connect\",\"addrs\":[\"" + node.addr + "\"]}");
                assertEquals("{\"id\":1,\"ok\":{\"client\":\"c1\"}}", out.readLine());
                send(in, "{\"id\":2,\"cmd\":\"acquire\",\"client\":\"c1\",\"key\":\"k\",\"lease_ms\":5000,\"limit\":2,\"value\":\"v\"}");
                String granted = out.readLine();
                assertTrue(granted.matches("\\{\"id\":2,\"ok\":\\{\"grant\":\"g2\",\"token\":\"[0-9]+\",\"slot\":0}}"), granted);
                send(in, "not json");
                assertTrue(out.readLine().contains("\"kind\":\"bad-argument\""));
                send(in, "{\"id\":3,\"cmd\":\"frobnicate\"}");
                assertEquals("{\"id\":3,\"error\":{\"kind\":\"bad-argument\",\"detail\":\"unknown cmd frobnicate\"}}",
                    out.readLine());
                send(in, "{\"id\":4,\"cmd\":\"acquire\",\"client\":\"c1\",\"key\":\"k\",\"lease_ms\":\"x\"}");
                assertTrue(out.readLine().startsWith("{\"id\":4,\"error\":{\"kind\":\"bad-argument\""));
                send(in, "{\"id\":5,\"cmd\":\"acquire\",\"client\":\"c1\",\"key\":\"k\",\"lease_ms\":5000,\"limit\":0}");
                assertTrue(out.readLine().startsWith("{\"id\":5,\"error\":{\"kind\":\"bad-argument\""));
                send(in, "{\"id\":6,\"cmd\":\"release\",\"grant\":\"g2\"}");
                assertEquals("{\"id\":6,\"ok\":{}}", out.readLine());
                send(in, "{\"id\":7,\"cmd\":\"release\",\"grant\":\"g2\"}");
                assertTrue(out.readLine().startsWith("{\"id\":7,\"error\":{\"kind\":\"closed\""));
                send(in, "{\"id\":8,\"cmd\":\"exit\"}");
                assertEquals("{\"id\":8,\"ok\":{}}", out.readLine());
                assertTrue(p.waitFor(2, TimeUnit.SECONDS), "exits within 2 s");
                assertEquals(0, p.exitValue());
            } finally {
                p.destroyForcibly();
                p.waitFor();
            }
        }
    }

    @Test
    void theEndOfStdinEndsTheDriverWithHeldGrants() throws Exception {
        try (Batond node = Batond.start()) {
            Process p = driver(false);
            try {
                OutputStream in = p.getOutputStream();
                BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
                out.readLine();
                send(in, "{\"id\":1,\"cmd\":\"connect\",\"addrs\":[\"" + node.addr + "\"]}");
                out.readLine();
                send(in, "{\"id\":2,\"cmd\":\"hold\",\"client\":\"c1\",\"key\":\"h\",\"lease_ms\":30000}");
                assertTrue(out.readLine().contains("\"grant\":\"g2\""));
                in.close();
                assertTrue(p.waitFor(2, TimeUnit.SECONDS), "exits within 2 s");
                assertEquals(0, p.exitValue());
                try (BatonClient c = BatonClient.connect(node.addr)) {
                    assertTrue(c.query("h").isFree(), "the held grant was released at exit");
                }
            } finally {
                p.destroyForcibly();
                p.waitFor();
            }
        }
    }

    private static void send(OutputStream in, String line) throws Exception {
        in.write((line + "\n").getBytes(StandardCharsets.UTF_8));
        in.flush();
    }
}
