package dev.baton;

import java.util.ArrayDeque;
import java.util.concurrent.Flow;

/** {@link BatonClient#watchPublisher}: one watch per subscriber, states buffered up to 1024 beyond demand. */
final class WatchPublisher implements Flow.Publisher<WatchState> {
    static final int MAX_BUFFER = 1024;

    private final BatonClient client;
    private final String key;

    WatchPublisher(BatonClient client, String key) {
        this.client = client;
        this.key = key;
    }

    @Override
    public void subscribe(Flow.Subscriber<? super WatchState> subscriber) {
        Sub s = new Sub(subscriber);
        subscriber.onSubscribe(s);
        s.begin();
    }

    private final class Sub implements Flow.Subscription, WatchListener {
        private final Flow.Subscriber<? super WatchState> subscriber;
        private final ArrayDeque<WatchState> buffer = new ArrayDeque<>();
        private long demand;
        private boolean cancelled;
        private boolean emitting;
        private BatonException error;
        private Watch watch;

        Sub(Flow.Subscriber<? super WatchState> subscriber) {
            this.subscriber = subscriber;
        }

        void begin() {
            Watch w;
            try {
                w = client.watch(key, this);
            } catch (BatonException e) {
                onError(e);
                return;
            }
            synchronized (this) {
                if (!cancelled) {
                    watch = w;
                    return;
                }
            }
            w.close();
        }

        @Override
        public void request(long n) {
            if (n <= 0) {
                cancel();
                subscriber.onError(new IllegalArgumentException("request must be positive (rule 3.9)"));
                return;
            }
            synchronized (this) {
                demand = demand + n < 0 ? Long.MAX_VALUE : demand + n;
            }
            emit();
        }

        @Override
        public void cancel() {
            Watch w;
            synchronized (this) {
                cancelled = true;
                buffer.clear();
                w = watch;
            }
            if (w != null) {
                w.close();
            }
        }

        @Override
        public void onState(WatchState state) {
            synchronized (this) {
                if (cancelled) {
                    return;
                }
                if (buffer.size() >= MAX_BUFFER) {
                    buffer.pollFirst();
                }
                buffer.addLast(state);
            }
            emit();
        }

        @Override
        public void onError(BatonException e) {
            synchronized (this) {
                error = e;
            }
            emit();
        }

        private void emit() {
            synchronized (this) {
                if (emitting) {
                    return;
                }
                emitting = true;
            }
            while (true) {
                WatchState next = null;
                BatonException failed = null;
                synchronized (this) {
                    if (cancelled) {
                        emitting = false;
                        return;
                    }
                    if (demand > 0 && !buffer.isEmpty()) {
                        next = buffer.pollFirst();
                        demand--;
                    } else if (error != null && buffer.isEmpty()) {
                        failed = error;
                        cancelled = true;
                    } else {
                        emitting = false;
                        return;
                    }
                }
                if (failed != null) {
                    subscriber.onError(failed);
                    return;
                }
                subscriber.onNext(next);
            }
        }
    }
}
