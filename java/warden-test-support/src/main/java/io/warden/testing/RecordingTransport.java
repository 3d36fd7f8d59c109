package io.warden.testing;

import io.warden.Transport;
import io.warden.WaitConnection;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * A transport around another that records what is sent on waiter connections, and can hand out
 * waiter connections late (as a busy pool would).
 */
public final class RecordingTransport implements Transport {
  private final Transport inner;
  private final List<List<String>> waits = new CopyOnWriteArrayList<>();
  private final ScheduledExecutorService delayer = Executors.newSingleThreadScheduledExecutor();
  private volatile long connectionDelayMillis;
  private volatile int waitConnections;
  private volatile Runnable beforeWait = () -> {};
  private volatile String delayedCommand;
  private volatile long commandDelayMillis;
  // Delayed commands not sent yet: a close sends them (they fail) rather than leave them pending.
  private final Set<Runnable> unsent = ConcurrentHashMap.newKeySet();

  public RecordingTransport(Transport inner) {
    this.inner = inner;
  }

  /** Waiter connections are handed out this much later. */
  public void delayConnections(long millis) {
    connectionDelayMillis = millis;
  }

  /**
   * Commands named {@code command} on the shared connection are sent this much later (one still
   * waiting when the transport closes is sent then, and fails).
   */
  public void delayCommand(String command, long millis) {
    delayedCommand = command;
    commandDelayMillis = millis;
  }

  /** Runs before each command on a waiter connection is sent. */
  public void beforeWait(Runnable r) {
    beforeWait = r;
  }

  /** The commands sent on waiter connections, as strings. */
  public List<List<String>> waits() {
    return waits;
  }

  /** How many waiter connections were asked for. */
  public int waitConnectionsAsked() {
    return waitConnections;
  }

  @Override
  public CompletionStage<Object> execute(byte[]... args) {
    String delayed = delayedCommand;
    if (delayed == null || !delayed.equalsIgnoreCase(new String(args[0], StandardCharsets.UTF_8))) {
      return inner.execute(args);
    }
    CompletableFuture<Object> f = new CompletableFuture<>();
    Runnable send =
        () -> {
          CompletionStage<Object> sent;
          try {
            sent = inner.execute(args);
          } catch (RuntimeException e) {
            f.completeExceptionally(e);
            return;
          }
          sent.whenComplete(
              (r, e) -> {
                if (e != null) {
                  f.completeExceptionally(e);
                } else {
                  f.complete(r);
                }
              });
        };
    unsent.add(send);
    try {
      delayer.schedule(
          () -> {
            if (unsent.remove(send)) {
              send.run();
            }
          },
          commandDelayMillis,
          TimeUnit.MILLISECONDS);
    } catch (RejectedExecutionException closed) {
      if (unsent.remove(send)) {
        send.run();
      }
    }
    return f;
  }

  @Override
  public CompletionStage<WaitConnection> waitConnection(long deadlineNanos) {
    waitConnections++;
    long delay = connectionDelayMillis;
    CompletableFuture<Void> later = new CompletableFuture<>();
    if (delay > 0) {
      delayer.schedule(() -> later.complete(null), delay, TimeUnit.MILLISECONDS);
    } else {
      later.complete(null);
    }
    return later.thenCompose(
        v ->
            inner
                .waitConnection(deadlineNanos)
                .thenApply(c -> c == null ? null : (WaitConnection) new Recording(c)));
  }

  @Override
  public void close() {
    delayer.shutdownNow();
    inner.close();
    for (Runnable r : unsent) {
      if (unsent.remove(r)) {
        r.run();
      }
    }
  }

  private final class Recording implements WaitConnection {
    private final WaitConnection c;

    Recording(WaitConnection c) {
      this.c = c;
    }

    @Override
    public long clientId() {
      return c.clientId();
    }

    @Override
    public CompletionStage<Object> execute(long replyTimeoutMillis, byte[]... args) {
      List<String> s = new ArrayList<>();
      for (byte[] a : args) {
        s.add(new String(a, StandardCharsets.UTF_8));
      }
      beforeWait.run();
      waits.add(s);
      return c.execute(replyTimeoutMillis, args);
    }

    @Override
    public void release() {
      c.release();
    }

    @Override
    public void close() {
      c.close();
    }
  }
}
