// CuratorTool: a tiny CLI around the REAL Apache Curator 5.x queue / SharedCount recipes
// (Debian's libcurator-*-java 5.4.0 jars), driven by zkq's Rust integration tests and
// benchmarks as a child process. See tests/java/README.md for the command list.
//
// Conventions: payloads are given and printed as lowercase hex, "-" = empty byte string.
// Results go to stdout (one per line, flushed); diagnostics to stderr.
// Exit codes: 0 ok, 1 runtime error, 2 usage error, 3 bench drain timed out.

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.api.ACLProvider;
import org.apache.curator.framework.recipes.queue.DistributedDelayQueue;
import org.apache.curator.framework.recipes.queue.DistributedIdQueue;
import org.apache.curator.framework.recipes.queue.DistributedPriorityQueue;
import org.apache.curator.framework.recipes.queue.DistributedQueue;
import org.apache.curator.framework.recipes.queue.ErrorMode;
import org.apache.curator.framework.recipes.queue.MultiItem;
import org.apache.curator.framework.recipes.queue.QueueBase;
import org.apache.curator.framework.recipes.queue.QueueBuilder;
import org.apache.curator.framework.recipes.queue.QueueConsumer;
import org.apache.curator.framework.recipes.queue.QueueSerializer;
import org.apache.curator.framework.recipes.queue.SimpleDistributedQueue;
import org.apache.curator.framework.recipes.shared.SharedCount;
import org.apache.curator.framework.recipes.shared.SharedCountListener;
import org.apache.curator.framework.recipes.shared.SharedCountReader;
import org.apache.curator.framework.recipes.shared.VersionedValue;
import org.apache.curator.framework.state.ConnectionState;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;

public final class CuratorTool {

    static final int SESSION_TIMEOUT_MS = 10_000;
    static final int CONNECTION_TIMEOUT_MS = 5_000;
    static final int PRIORITY_MIN_ITEMS_BEFORE_REFRESH = 0;

    /** stdout with explicit flushing; once {@link #seal(String)} is called nothing more is printed. */
    static final PrintStream OUT = new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    static boolean outSealed = false;

    static synchronized void out(String line) {
        if (outSealed) {
            System.err.println("CuratorTool: late output suppressed: " + line);
            return;
        }
        OUT.println(line);
        OUT.flush();
    }

    /** Print lastLine (if not null) and suppress all later output. */
    static synchronized void seal(String lastLine) {
        if (!outSealed) {
            if (lastLine != null) OUT.println(lastLine);
            OUT.flush();
            outSealed = true;
        }
    }

    static void err(String msg) {
        System.err.println("CuratorTool: " + msg);
        System.err.flush();
    }

    static final class UsageException extends Exception {
        UsageException(String m) { super(m); }
    }

    /** Thrown on purpose by --fail-every; no stack trace so Curator's error log stays short. */
    static final class InjectedFailure extends Exception {
        InjectedFailure(String m) { super(m); }
        @Override public synchronized Throwable fillInStackTrace() { return this; }
    }

    static final QueueSerializer<byte[]> IDENTITY = new QueueSerializer<byte[]>() {
        @Override public byte[] serialize(byte[] item) { return item; }
        @Override public byte[] deserialize(byte[] bytes) { return bytes; }
    };

    // ------------------------------------------------------------------ hex

    static String hex(byte[] b) {
        if (b == null) return "null";
        if (b.length == 0) return "-";
        StringBuilder sb = new StringBuilder(b.length * 2);
        for (byte x : b) {
            sb.append(Character.forDigit((x >> 4) & 0xf, 16)).append(Character.forDigit(x & 0xf, 16));
        }
        return sb.toString();
    }

    static byte[] unhex(String s) throws UsageException {
        if (s.equals("-")) return new byte[0];
        if (s.isEmpty() || (s.length() % 2) != 0) throw new UsageException("bad hex payload: '" + s + "' (use - for empty)");
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) {
            int hi = Character.digit(s.charAt(2 * i), 16);
            int lo = Character.digit(s.charAt(2 * i + 1), 16);
            if (hi < 0 || lo < 0) throw new UsageException("bad hex payload: '" + s + "'");
            out[i] = (byte) ((hi << 4) | lo);
        }
        return out;
    }

    static List<byte[]> unhexAll(List<String> args, int from) throws UsageException {
        List<byte[]> items = new ArrayList<>();
        for (int i = from; i < args.size(); i++) items.add(unhex(args.get(i)));
        return items;
    }

    static MultiItem<byte[]> multi(List<byte[]> items) {
        final Iterator<byte[]> it = items.iterator();
        return () -> it.hasNext() ? it.next() : null;
    }

    static int parseInt(String s, String what) throws UsageException {
        try { return Integer.parseInt(s); } catch (NumberFormatException e) { throw new UsageException("bad " + what + ": " + s); }
    }

    static long parseLong(String s, String what) throws UsageException {
        try { return Long.parseLong(s); } catch (NumberFormatException e) { throw new UsageException("bad " + what + ": " + s); }
    }

    static void need(List<String> a, int n, String usage) throws UsageException {
        if (a.size() < n) throw new UsageException("usage: " + usage);
    }

    // ------------------------------------------------------------------ main

    public static void main(String[] argv) {
        // Must happen before any slf4j logger is created (i.e. before touching Curator/ZooKeeper classes).
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
        System.setProperty("org.slf4j.simpleLogger.showThreadName", "false");
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        System.setProperty("org.slf4j.simpleLogger.dateTimeFormat", "HH:mm:ss.SSS");
        // ZooKeeper 3.8's client logs a WARN with a stack trace on every normal close
        // ("An exception was thrown while closing send thread"); connection trouble is reported by our
        // own connection-state listener instead (see run()).
        System.setProperty("org.slf4j.simpleLogger.log.org.apache.zookeeper.ClientCnxn", "error");
        // Logs "There are no ConnectionStateListeners registered." when a short run closes the client before
        // the CONNECTED event was dispatched; state changes are printed by our own listener.
        System.setProperty("org.slf4j.simpleLogger.log.org.apache.curator.framework.state.ConnectionStateManager", "error");
        System.setProperty("zookeeper.jmx.log4j.disable", "true");

        int code;
        try {
            code = run(Arrays.asList(argv));
        } catch (UsageException e) {
            err(e.getMessage());
            code = 2;
        } catch (Throwable t) {
            err("error: " + t);
            t.printStackTrace(System.err);
            code = 1;
        }
        OUT.flush();
        System.err.flush();
        System.exit(code);
    }

    static final String USAGE =
        "CuratorTool <connectString> <command> [args...]\n"
        + "  put fifo PATH HEX...            putmulti fifo PATH HEX...\n"
        + "  put priority PATH PRIO HEX...   putmulti priority PATH PRIO HEX...\n"
        + "  put delay PATH EPOCH_MS HEX...  putmulti delay PATH EPOCH_MS HEX...\n"
        + "  put id PATH ID HEX...           remove id PATH ID\n"
        + "  offer simple PATH HEX...\n"
        + "  consume fifo|priority|delay|id|simple PATH COUNT TIMEOUT_MS [--lock LOCKPATH] [--fail-every N]\n"
        + "          [--error-mode requeue|delete] [--hold-ms MS]\n"
        + "  count get PATH | count set PATH N | count tryset PATH N | count watch PATH TIMEOUT_MS\n"
        + "  bench put|put-background PATH N SIZE | bench drain PATH N TIMEOUT_MS [--lock LOCKPATH] [--consumers K]";

    static int run(List<String> argv) throws Exception {
        if (argv.size() < 2) throw new UsageException(USAGE);
        String connect = argv.get(0);
        String cmd = argv.get(1);
        List<String> a = argv.subList(2, argv.size());
        switch (cmd) {
            case "put": case "putmulti": case "remove": case "offer": case "consume": case "count": case "bench":
                break;
            default:
                throw new UsageException("unknown command '" + cmd + "'\n" + USAGE);
        }

        CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder()
            .connectString(connect)
            .sessionTimeoutMs(SESSION_TIMEOUT_MS)
            .connectionTimeoutMs(CONNECTION_TIMEOUT_MS)
            .retryPolicy(new ExponentialBackoffRetry(100, 3));
        // Credentials and node ACLs for secured ensembles, as JVM system properties:
        //   -Dzkq.test.auth=SCHEME:CREDENTIALS (e.g. digest:app:secret), sent on every connection;
        //   -Dzkq.test.acl=creator: nodes Curator creates get CREATOR_ALL_ACL (auth::cdrwa).
        // TLS and SASL need no code: ZooKeeper's client reads zookeeper.ssl.* and the JAAS file itself.
        String auth = System.getProperty("zkq.test.auth");
        if (auth != null) {
            int colon = auth.indexOf(':');
            if (colon < 1) throw new UsageException("zkq.test.auth must be SCHEME:CREDENTIALS");
            builder.authorization(auth.substring(0, colon), auth.substring(colon + 1).getBytes(StandardCharsets.UTF_8));
        }
        if ("creator".equals(System.getProperty("zkq.test.acl"))) {
            builder.aclProvider(new ACLProvider() {
                @Override public List<ACL> getDefaultAcl() { return ZooDefs.Ids.CREATOR_ALL_ACL; }
                @Override public List<ACL> getAclForPath(String path) { return ZooDefs.Ids.CREATOR_ALL_ACL; }
            });
        }
        CuratorFramework client = builder.build();
        client.getConnectionStateListenable().addListener((c, state) -> {
            if (state != ConnectionState.CONNECTED) err("connection state: " + state);
        });
        try {
            client.start();
            if (!client.blockUntilConnected(CONNECTION_TIMEOUT_MS + 1000, TimeUnit.MILLISECONDS)) {
                err("could not connect to ZooKeeper at " + connect);
                return 1;
            }
            switch (cmd) {
                case "put": return doPut(client, a, false);
                case "putmulti": return doPut(client, a, true);
                case "remove": return doRemove(client, a);
                case "offer": return doOffer(client, a);
                case "consume": return doConsume(client, a);
                case "count": return doCount(client, a);
                case "bench": return doBench(client, a);
                default: throw new IllegalStateException();
            }
        } finally {
            client.close();
        }
    }

    // ------------------------------------------------------------------ producers

    static QueueBuilder<byte[]> builder(CuratorFramework client, QueueConsumer<byte[]> consumer, String path) {
        return QueueBuilder.builder(client, consumer, IDENTITY, path);
    }

    static void flushOrFail(QueueBase<byte[]> q) throws Exception {
        if (!q.flushPuts(10, TimeUnit.SECONDS)) throw new IllegalStateException("flushPuts(10s) returned false");
    }

    static int doPut(CuratorFramework client, List<String> a, boolean isMulti) throws Exception {
        String verb = isMulti ? "putmulti" : "put";
        need(a, 2, verb + " fifo|priority|delay|id PATH [PRIO|EPOCH_MS|ID] HEX...");
        String kind = a.get(0);
        String path = a.get(1);
        switch (kind) {
            case "fifo": {
                List<byte[]> items = unhexAll(a, 2);
                DistributedQueue<byte[]> q = builder(client, null, path).putInBackground(false).buildQueue();
                try {
                    q.start();
                    if (isMulti) q.putMulti(multi(items)); else for (byte[] it : items) q.put(it);
                    flushOrFail(q);
                } finally { q.close(); }
                return 0;
            }
            case "priority": {
                need(a, 3, verb + " priority PATH PRIORITY HEX...");
                int prio = parseInt(a.get(2), "priority");
                List<byte[]> items = unhexAll(a, 3);
                DistributedPriorityQueue<byte[]> q = builder(client, null, path).putInBackground(false)
                    .buildPriorityQueue(PRIORITY_MIN_ITEMS_BEFORE_REFRESH);
                try {
                    q.start();
                    if (isMulti) q.putMulti(multi(items), prio); else for (byte[] it : items) q.put(it, prio);
                    flushOrFail(q);
                } finally { q.close(); }
                return 0;
            }
            case "delay": {
                need(a, 3, verb + " delay PATH EPOCH_MS HEX...");
                long epoch = parseLong(a.get(2), "epoch ms");
                List<byte[]> items = unhexAll(a, 3);
                DistributedDelayQueue<byte[]> q = builder(client, null, path).putInBackground(false).buildDelayQueue();
                try {
                    q.start();
                    if (isMulti) q.putMulti(multi(items), epoch); else for (byte[] it : items) q.put(it, epoch);
                    flushOrFail(q);
                } finally { q.close(); }
                return 0;
            }
            case "id": {
                if (isMulti) throw new UsageException("DistributedIdQueue has no putMulti");
                need(a, 3, "put id PATH ID HEX...");
                String id = a.get(2);
                List<byte[]> items = unhexAll(a, 3);
                DistributedIdQueue<byte[]> q = builder(client, null, path).putInBackground(false).buildIdQueue();
                try {
                    q.start();
                    for (byte[] it : items) q.put(it, id);
                    flushOrFail(q);
                } finally { q.close(); }
                return 0;
            }
            default:
                throw new UsageException("unknown queue kind for " + verb + ": " + kind);
        }
    }

    static int doRemove(CuratorFramework client, List<String> a) throws Exception {
        need(a, 3, "remove id PATH ID");
        if (!a.get(0).equals("id")) throw new UsageException("only 'remove id PATH ID' is supported");
        DistributedIdQueue<byte[]> q = builder(client, null, a.get(1)).putInBackground(false).buildIdQueue();
        try {
            q.start();
            out(Integer.toString(q.remove(a.get(2))));
        } finally { q.close(); }
        return 0;
    }

    static int doOffer(CuratorFramework client, List<String> a) throws Exception {
        need(a, 2, "offer simple PATH HEX...");
        if (!a.get(0).equals("simple")) throw new UsageException("only 'offer simple PATH HEX...' is supported");
        List<byte[]> items = unhexAll(a, 2);
        SimpleDistributedQueue q = new SimpleDistributedQueue(client, a.get(1));
        for (byte[] it : items) {
            if (!q.offer(it)) throw new IllegalStateException("offer returned false");
        }
        return 0;
    }

    // ------------------------------------------------------------------ consumers

    static final class ConsumeOptions {
        String lockPath;
        int failEvery;              // 0 = never
        ErrorMode errorMode;        // null = Curator default (REQUEUE)
        long holdMs;
    }

    static ConsumeOptions parseOptions(List<String> a, int from, boolean allowAll) throws UsageException {
        ConsumeOptions o = new ConsumeOptions();
        for (int i = from; i < a.size(); i++) {
            String k = a.get(i);
            if (i + 1 >= a.size()) throw new UsageException("option " + k + " needs a value");
            String v = a.get(++i);
            switch (k) {
                case "--lock": o.lockPath = v; break;
                case "--fail-every":
                    if (!allowAll) throw new UsageException("unsupported option " + k);
                    o.failEvery = parseInt(v, "--fail-every");
                    if (o.failEvery < 0) throw new UsageException("--fail-every must be >= 0");
                    break;
                case "--error-mode":
                    if (!allowAll) throw new UsageException("unsupported option " + k);
                    if (v.equals("requeue")) o.errorMode = ErrorMode.REQUEUE;
                    else if (v.equals("delete")) o.errorMode = ErrorMode.DELETE;
                    else throw new UsageException("--error-mode must be requeue|delete");
                    break;
                case "--hold-ms":
                    if (!allowAll) throw new UsageException("unsupported option " + k);
                    o.holdMs = parseLong(v, "--hold-ms");
                    break;
                default: throw new UsageException("unknown option " + k);
            }
        }
        return o;
    }

    /**
     * State shared by the consumer callback, the gating executor and the main thread.
     *
     * Curator's consume loop hands every queue node to the QueueBuilder executor. We install a
     * direct executor that refuses to run anything once we are "stopped": a refused node is never
     * touched (no getData, no delete, no lock), so it stays in the queue for the next consumer.
     * We stop right after the node that brought the success count to COUNT has been fully processed
     * (consumeMessage returned AND Curator deleted the node / lock), or when the main thread times out.
     * A refused runnable never releases Curator's per-pass semaphore, so the loop thread parks until
     * queue.close() interrupts it - which is exactly what we want.
     */
    static final class Gate implements Executor, QueueConsumer<byte[]> {
        final int target;
        final int failEvery;
        final long holdMs;
        final boolean printItems;

        int calls;          // consumeMessage calls
        int successes;      // successful (printed) items
        boolean stopped;
        int inFlight;       // nodes being processed (several consumers may share one gate)
        long startNanos;
        long doneNanos;     // when successes reached target

        Gate(int target, int failEvery, long holdMs, boolean printItems) {
            this.target = target;
            this.failEvery = failEvery;
            this.holdMs = holdMs;
            this.printItems = printItems;
        }

        @Override
        public void execute(Runnable r) {
            synchronized (this) {
                if (stopped) return;   // leave the node alone
                inFlight++;
            }
            try {
                r.run();
            } finally {
                synchronized (this) {
                    inFlight--;
                    if (successes >= target) stopped = true;
                    notifyAll();
                }
            }
        }

        @Override
        public void consumeMessage(byte[] message) throws Exception {
            boolean fail;
            synchronized (this) {
                if (successes >= target) {
                    // Another item of the same multi-item znode after COUNT was reached. The node is
                    // (or will be) deleted as a unit, so this item is consumed but not counted.
                    out("EXTRA " + hex(message));
                    err("item delivered after COUNT was reached (same putMulti node): " + hex(message));
                    return;
                }
                calls++;
                fail = failEvery > 0 && (calls % failEvery) == 0;
                if (!fail) {
                    successes++;
                    if (successes == target) doneNanos = System.nanoTime();
                }
                if (printItems || fail) out(fail ? "FAIL " + hex(message) : hex(message));
            }
            if (holdMs > 0) Thread.sleep(holdMs);
            if (fail) throw new InjectedFailure("injected failure (--fail-every " + failEvery + ")");
        }

        @Override
        public void stateChanged(CuratorFramework client, ConnectionState newState) {
            // Never called by Curator 5.x (the queue does not register its consumer), see docs/curator-format.md §1.11.
        }

        /** Wait until target reached (and its node fully processed) or the deadline; then stop. */
        synchronized void awaitAndStop(long deadlineNanos, long inFlightGraceMs) throws InterruptedException {
            while (!stopped) {
                long left = deadlineNanos - System.nanoTime();
                if (left <= 0) break;
                TimeUnit.NANOSECONDS.timedWait(this, left);
            }
            stopped = true;
            long graceEnd = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(inFlightGraceMs);
            while (inFlight > 0) {
                long left = graceEnd - System.nanoTime();
                if (left <= 0) {
                    err("an item was still being processed when giving up; closing anyway");
                    break;
                }
                TimeUnit.NANOSECONDS.timedWait(this, left);
            }
        }

        synchronized int successes() { return successes; }
    }

    static QueueBase<byte[]> buildConsumerQueue(CuratorFramework client, String kind, String path, Gate gate, String lockPath)
        throws UsageException {
        QueueBuilder<byte[]> b = builder(client, gate, path).executor(gate);
        if (lockPath != null) b = b.lockPath(lockPath);
        switch (kind) {
            case "fifo": return b.buildQueue();
            case "priority": return b.buildPriorityQueue(PRIORITY_MIN_ITEMS_BEFORE_REFRESH);
            case "delay": return b.buildDelayQueue();
            case "id": return b.buildIdQueue();
            default: throw new UsageException("unknown queue kind: " + kind);
        }
    }

    static int doConsume(CuratorFramework client, List<String> a) throws Exception {
        need(a, 4, "consume KIND PATH COUNT TIMEOUT_MS [--lock LOCKPATH] [--fail-every N] [--error-mode requeue|delete] [--hold-ms MS]");
        String kind = a.get(0);
        String path = a.get(1);
        int count = parseInt(a.get(2), "COUNT");
        long timeoutMs = parseLong(a.get(3), "TIMEOUT_MS");
        ConsumeOptions o = parseOptions(a, 4, true);
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);

        if (kind.equals("simple")) return consumeSimple(client, path, count, deadline, o);

        if (o.errorMode != null && o.lockPath == null) {
            throw new UsageException("--error-mode needs --lock (Curator's setErrorMode requires a lockPath)");
        }
        if (count <= 0) {
            seal("DONE 0");
            return 0;
        }
        Gate gate = new Gate(count, o.failEvery, o.holdMs, true);
        QueueBase<byte[]> q = buildConsumerQueue(client, kind, path, gate, o.lockPath);
        try {
            // REQUEUE is Curator's default; setting it explicitly only logs a "requires ZooKeeper 3.4.x+" WARN.
            if (o.errorMode == ErrorMode.DELETE) q.setErrorMode(o.errorMode);
            q.start();
            gate.awaitAndStop(deadline, o.holdMs + 10_000);
        } finally {
            q.close();
        }
        seal("DONE " + gate.successes());
        return 0;
    }

    static int consumeSimple(CuratorFramework client, String path, int count, long deadline, ConsumeOptions o) throws Exception {
        if (o.failEvery > 0 || o.errorMode != null) err("--fail-every/--error-mode are ignored for simple queues");
        if (o.lockPath != null) err("--lock is ignored for simple queues");
        SimpleDistributedQueue q = new SimpleDistributedQueue(client, path);
        int got = 0;
        while (got < count) {
            long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            if (left <= 0) break;
            byte[] item = q.poll(left, TimeUnit.MILLISECONDS);
            if (item == null) continue;   // timed out (loop re-checks) or spurious
            got++;
            out(hex(item));
            if (o.holdMs > 0) Thread.sleep(o.holdMs);
        }
        seal("DONE " + got);
        return 0;
    }

    // ------------------------------------------------------------------ SharedCount

    static String vv(VersionedValue<Integer> v) {
        return v.getValue() + " " + v.getVersion();
    }

    static int doCount(CuratorFramework client, List<String> a) throws Exception {
        need(a, 2, "count get|set|tryset|watch PATH ...");
        String sub = a.get(0);
        String path = a.get(1);
        SharedCount sc = new SharedCount(client, path, 0);
        try {
            switch (sub) {
                case "get": {
                    sc.start();
                    out(vv(sc.getVersionedValue()));
                    return 0;
                }
                case "set": {
                    need(a, 3, "count set PATH N");
                    int n = parseInt(a.get(2), "N");
                    sc.start();
                    sc.setCount(n);
                    out(vv(sc.getVersionedValue()));
                    return 0;
                }
                case "tryset": {
                    need(a, 3, "count tryset PATH N");
                    int n = parseInt(a.get(2), "N");
                    sc.start();
                    try {
                        out(Boolean.toString(sc.trySetCount(sc.getVersionedValue(), n)));
                    } catch (Exception e) {
                        // IllegalTrySetVersionException only exists from Curator 5.6/5.7 on; match by name so
                        // this file compiles against 5.4.0 too.
                        if (e.getClass().getSimpleName().equals("IllegalTrySetVersionException")) {
                            out("illegal-version");
                        } else {
                            throw e;
                        }
                    }
                    return 0;
                }
                case "watch": {
                    need(a, 3, "count watch PATH TIMEOUT_MS");
                    long timeoutMs = parseLong(a.get(2), "TIMEOUT_MS");
                    final Object lock = new Object();
                    final int[] lastVersion = {Integer.MIN_VALUE};
                    SharedCountListener l = new SharedCountListener() {
                        @Override
                        public void countHasChanged(SharedCountReader reader, int newCount) {
                            VersionedValue<Integer> v = reader.getVersionedValue();
                            synchronized (lock) {
                                if (v.getVersion() == lastVersion[0]) return;   // already printed
                                lastVersion[0] = v.getVersion();
                                out(vv(v));
                            }
                        }

                        @Override
                        public void stateChanged(CuratorFramework c, ConnectionState s) {
                            err("connection state: " + s);
                        }
                    };
                    sc.addListener(l);
                    sc.start();
                    synchronized (lock) {
                        VersionedValue<Integer> v = sc.getVersionedValue();
                        if (v.getVersion() != lastVersion[0]) {
                            lastVersion[0] = v.getVersion();
                            out(vv(v));
                        }
                    }
                    Thread.sleep(Math.max(0, timeoutMs));
                    synchronized (lock) { seal(null); }
                    return 0;
                }
                default:
                    throw new UsageException("unknown count subcommand: " + sub);
            }
        } finally {
            sc.close();
        }
    }

    // ------------------------------------------------------------------ benchmarks

    static String rate(long n, long nanos) {
        double ms = nanos / 1e6;
        double perSec = ms > 0 ? n * 1000.0 / ms : 0;
        return String.format(java.util.Locale.ROOT, "%d ms = %.1f msg/s", Math.round(ms), perSec);
    }

    static int doBench(CuratorFramework client, List<String> a) throws Exception {
        need(a, 1, "bench put|put-background|drain ...");
        switch (a.get(0)) {
            case "put":
            case "put-background": {
                // put: Curator's synchronous put (each returns once ZooKeeper created the node).
                // put-background: Curator's default, putInBackground(true): put() returns at once and
                // confirms nothing; the figure is taken when flushPuts saw every create succeed.
                boolean background = a.get(0).equals("put-background");
                need(a, 4, "bench " + a.get(0) + " PATH N SIZE");
                String path = a.get(1);
                int n = parseInt(a.get(2), "N");
                int size = parseInt(a.get(3), "SIZE");
                byte[][] payloads = new byte[n][];
                for (int i = 0; i < n; i++) {
                    byte[] p = new byte[size];
                    for (int j = 0; j < size; j++) p[j] = (byte) ('a' + ((i + j) % 26));
                    payloads[i] = p;
                }
                DistributedQueue<byte[]> q = builder(client, null, path).putInBackground(background).buildQueue();
                try {
                    q.start();
                    long t0 = System.nanoTime();
                    for (int i = 0; i < n; i++) q.put(payloads[i]);
                    long returned = System.nanoTime();
                    if (!q.flushPuts(300, TimeUnit.SECONDS)) throw new IllegalStateException("flushPuts(300s) returned false");
                    long t1 = System.nanoTime();
                    if (background) {
                        out("put-background " + n + " msgs stored (flushPuts) in " + rate(n, t1 - t0)
                            + "; put() returned for all in " + rate(n, returned - t0));
                    } else {
                        out("put " + n + " msgs in " + rate(n, t1 - t0));
                    }
                } finally { q.close(); }
                return 0;
            }
            case "drain": {
                need(a, 4, "bench drain PATH N TIMEOUT_MS [--lock LOCKPATH] [--consumers K]");
                String path = a.get(1);
                int n = parseInt(a.get(2), "N");
                long timeoutMs = parseLong(a.get(3), "TIMEOUT_MS");
                // --consumers K: K DistributedQueue consumers in this process, each with its own
                // ZooKeeper session (as K separate services would), sharing one count.
                int consumers = 1;
                List<String> rest = new ArrayList<>(a.subList(4, a.size()));
                int at = rest.indexOf("--consumers");
                if (at >= 0) {
                    if (at + 1 >= rest.size()) throw new UsageException("--consumers needs a value");
                    consumers = parseInt(rest.get(at + 1), "--consumers");
                    rest.remove(at + 1);
                    rest.remove(at);
                }
                ConsumeOptions o = parseOptions(rest, 0, false);
                if (n <= 0 || consumers <= 0) throw new UsageException("N and K must be > 0");
                Gate gate = new Gate(n, 0, 0, false);
                List<CuratorFramework> clients = new ArrayList<>();
                List<QueueBase<byte[]>> queues = new ArrayList<>();
                clients.add(client);
                for (int i = 1; i < consumers; i++) {
                    CuratorFramework extra = CuratorFrameworkFactory.newClient(
                        client.getZookeeperClient().getCurrentConnectionString(), new ExponentialBackoffRetry(100, 3));
                    extra.start();
                    extra.blockUntilConnected();
                    clients.add(extra);
                }
                for (CuratorFramework c : clients) queues.add(buildConsumerQueue(c, "fifo", path, gate, o.lockPath));
                long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
                long t0;
                try {
                    t0 = System.nanoTime();
                    gate.startNanos = t0;
                    for (QueueBase<byte[]> q : queues) q.start();
                    gate.awaitAndStop(deadline, 10_000);
                } finally {
                    for (QueueBase<byte[]> q : queues) q.close();
                    for (int i = 1; i < clients.size(); i++) clients.get(i).close();
                }
                int got = gate.successes();
                long end;
                synchronized (gate) { end = got >= n ? gate.doneNanos : System.nanoTime(); }
                out("drained " + got + " msgs in " + rate(got, end - t0));
                if (got < n) {
                    err("timeout: drained only " + got + " of " + n);
                    return 3;
                }
                return 0;
            }
            default:
                throw new UsageException("unknown bench subcommand: " + a.get(0));
        }
    }
}
