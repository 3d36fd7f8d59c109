package io.warden.spi;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.warden.WaitConnection;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** The pool's hand-outs: one wait per connection at a time, whatever its holders do twice. */
class WaitPoolTest {
  private static final class Fake extends WaitPool.Pooled {
    final long id;
    boolean closedConnection;

    Fake(long id) {
      this.id = id;
    }

    @Override
    public long clientId() {
      return id;
    }

    @Override
    public CompletionStage<Object> execute(long replyTimeoutMillis, byte[]... args) {
      return CompletableFuture.completedFuture(id);
    }

    @Override
    protected void closeConnection() {
      closedConnection = true;
    }
  }

  private static final class Pool extends WaitPool {
    final AtomicInteger opened = new AtomicInteger();
    final java.util.List<Fake> all = new java.util.ArrayList<>();

    Pool() {
      super(4, 4);
    }

    @Override
    protected CompletionStage<? extends Pooled> open() {
      Fake f = new Fake(opened.incrementAndGet());
      all.add(f);
      return CompletableFuture.completedFuture(f);
    }
  }

  private static WaitConnection take(Pool pool) throws Exception {
    return pool.acquire(Long.MAX_VALUE).toCompletableFuture().get();
  }

  @Test
  void aSecondReleaseOrCloseByAnEndedHolderTouchesNothing() throws Exception {
    try (Pool pool = new Pool()) {
      WaitConnection first = take(pool);
      first.release();
      WaitConnection second = take(pool);
      assertEquals(first.clientId(), second.clientId(), "the idle connection is reused");
      first.release(); // late, twice: ignored
      WaitConnection third = take(pool);
      assertNotEquals(second.clientId(), third.clientId(), "never two waits on one connection");
      first.close(); // late: ignored
      assertEquals(false, pool.all.get(0).closedConnection, "the connection the second wait uses");
      ExecutionException e =
          assertThrows(
              ExecutionException.class,
              () -> first.execute(10, new byte[0]).toCompletableFuture().get());
      assertEquals("this waiter connection was already given back", e.getCause().getMessage());
      assertEquals(1L, second.execute(10, new byte[0]).toCompletableFuture().get());
    }
  }

  @Test
  void closeClosesTheConnectionsInUseAsWellAsTheIdle() throws Exception {
    Pool pool = new Pool();
    WaitConnection busy = take(pool);
    WaitConnection idle = take(pool);
    idle.release();
    pool.close();
    assertEquals(true, pool.all.get(0).closedConnection, "the one a wait uses");
    assertEquals(true, pool.all.get(1).closedConnection, "the idle one");
    assertEquals(0, pool.openConnections());
    busy.release(); // after close: ignored, not offered again
    busy.close();
    assertEquals(0, pool.openConnections());
  }
}
