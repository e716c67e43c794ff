package dev.baton.bench;

import dev.baton.BatonClient;
import dev.baton.Grant;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.Lock;
import org.redisson.Redisson;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * Pairs/s (acquire + release, 16 threads on distinct keys) and handoffs/s
 * (16 threads on one key) for: the raw protocol (a socket per thread, one
 * request at a time), this client (one BatonClient shared by the threads),
 * and Redisson's RLock against a local redis-server.
 *
 * <p>Usage: Bench [baton host:port] [redis host:port] [threads] [seconds]
 */
public final class Bench {
    interface Loop {
        /** One acquire + release; the thread's index picks its key. */
        void pair(int thread) throws Exception;
    }

    interface Setup {
        Loop make(int thread) throws Exception;
    }

    static int threads = 16;
    static int seconds = 5;

    public static void main(String[] args) throws Exception {
        String baton = args.length > 0 ? args[0] : "127.0.0.1:7373";
        String redis = args.length > 1 ? args[1] : "127.0.0.1:6379";
        threads = args.length > 2 ? Integer.parseInt(args[2]) : 16;
        seconds = args.length > 3 ? Integer.parseInt(args[3]) : 5;
        String run = Long.toString(System.nanoTime());
        String host = baton.substring(0, baton.lastIndexOf(':'));
        int port = Integer.parseInt(baton.substring(baton.lastIndexOf(':') + 1));

        double rawPairs = measure("raw protocol, distinct keys", t -> raw(host, port, "rd-" + run + "-" + t));
        double rawHand = measure("raw protocol, one key", t -> raw(host, port, "rh-" + run));
        double javaPairs;
        double javaHand;
        try (BatonClient client = BatonClient.connect(baton)) {
            Duration lease = Duration.ofSeconds(30);
            javaPairs = measure("java client, distinct keys", t -> i -> {
                Grant g = client.acquire("jd-" + run + "-" + t, lease);
                g.release();
            });
            javaHand = measure("java client, one key", t -> i -> {
                Grant g = client.acquire("jh-" + run, lease);
                g.release();
            });
        }
        double redPairs = Double.NaN;
        double redHand = Double.NaN;
        RedissonClient redisson = null;
        try {
            Config config = new Config();
            config.useSingleServer().setAddress("redis://" + redis);
            redisson = Redisson.create(config);
            RedissonClient r = redisson;
            redPairs = measure("redisson RLock, distinct keys", t -> {
                Lock lock = r.getLock("rd-" + run + "-" + t);
                return i -> {
                    lock.lock();
                    lock.unlock();
                };
            });
            redHand = measure("redisson RLock, one key", t -> {
                Lock lock = r.getLock("rh-" + run);
                return i -> {
                    lock.lock();
                    lock.unlock();
                };
            });
        } catch (RuntimeException e) {
            System.out.println("redisson: " + e);
        } finally {
            if (redisson != null) {
                redisson.shutdown();
            }
        }
        System.out.printf("%nratios (%d threads):%n", threads);
        System.out.printf("  distinct keys: java/raw %.2fx, java/redisson %.2fx%n", javaPairs / rawPairs,
            javaPairs / redPairs);
        System.out.printf("  one key:       java/raw %.2fx, java/redisson %.2fx%n", javaHand / rawHand,
            javaHand / redHand);
        System.exit(0);
    }

    /** A raw-protocol loop on a socket of its own: A, read the grant, R, read the answer. */
    static Loop raw(String host, int port, String key) throws Exception {
        Socket s = new Socket(host, port);
        s.setTcpNoDelay(true);
        OutputStream out = s.getOutputStream();
        BufferedReader in = new BufferedReader(new InputStreamReader(s.getInputStream(), StandardCharsets.US_ASCII));
        byte[] acquire = ("A " + key + " 30 0\n").getBytes(StandardCharsets.US_ASCII);
        return i -> {
            out.write(acquire);
            String granted = in.readLine();
            String token = granted.split(" ")[1];
            out.write(("R " + key + " " + token + "\n").getBytes(StandardCharsets.US_ASCII));
            in.readLine();
        };
    }

    static String only = System.getProperty("bench.only", "");

    static double measure(String name, Setup setup) throws Exception {
        if (!name.contains(only)) {
            return Double.NaN;
        }
        LongAdder done = new LongAdder();
        AtomicBoolean counting = new AtomicBoolean();
        AtomicBoolean stop = new AtomicBoolean();
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Loop loop = setup.make(t);
            int index = t;
            Thread w = new Thread(() -> {
                try {
                    while (!stop.get()) {
                        loop.pair(index);
                        if (counting.get()) {
                            done.increment();
                        }
                    }
                } catch (Exception e) {
                    System.out.println(name + ": " + e);
                }
            });
            w.setDaemon(true);
            workers.add(w);
        }
        workers.forEach(Thread::start);
        Thread.sleep(1000); // warm up
        counting.set(true);
        long start = System.nanoTime();
        Thread.sleep(seconds * 1000L);
        counting.set(false);
        double rate = done.sum() / ((System.nanoTime() - start) / 1e9);
        stop.set(true);
        for (Thread w : workers) {
            w.join(10_000);
        }
        System.out.printf("%-32s %10.0f /s%n", name, rate);
        return rate;
    }
}
