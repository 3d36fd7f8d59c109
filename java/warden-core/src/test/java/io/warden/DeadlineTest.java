package io.warden;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class DeadlineTest {
  @Test
  void theWaitSentIsWhatRemainsLessTheMargin() {
    long ms = TimeUnit.MILLISECONDS.toNanos(1);
    // {deadline after, time already spent, WAIT sent (-1: send nothing)}
    long[][] cases = {
      {50, 0, 45}, {50, 20, 27}, {1000, 0, 995}, {5, 0, 4}, {2, 1, 1}, {50, 50, -1}, {50, 70, -1},
    };
    long start = 1_000_000_000L;
    for (long[] c : cases) {
      long deadline = Deadline.after(start, c[0] * ms);
      assertEquals(c[2], Deadline.waitArg(deadline, start + c[1] * ms), c[0] + " after " + c[1]);
    }
    assertEquals(0, Deadline.waitArg(Deadline.FOREVER, start));
    assertFalse(Deadline.passed(Deadline.FOREVER, Long.MAX_VALUE - 1));
    assertTrue(Deadline.passed(start, start));
    assertEquals(Deadline.FOREVER, Deadline.after(start, Long.MAX_VALUE));
  }

  @Test
  void serversThatUnblockModuleWaiters() {
    String[][] cases = {
      {"redis_version:7.0.15\n", "false"},
      {"redis_version:7.2.4\n", "false"},
      {"redis_version:7.4.0\n", "true"},
      {"redis_version:8.2.3\n", "true"},
      {"redis_version:7.2.4\nvalkey_version:7.2.5\n", "false"},
      {"redis_version:7.2.4\nvalkey_version:9.1.2\n", "true"},
    };
    for (String[] c : cases) {
      assertEquals(Boolean.parseBoolean(c[1]), Warden.unblocksModuleWaiters(c[0]), c[0]);
    }
  }

  @Test
  void unknownWardenCommandsGetTheHint() {
    Throwable t =
        Resp.unwrap(
            new WardenServerException(
                "ERR unknown command 'LOCK.ACQUIRE', with args beginning with: 'k' "));
    assertTrue(t instanceof WardenNotLoadedException);
    assertTrue(t.getMessage().contains("is warden loaded?"));
    Throwable other = Resp.unwrap(new WardenServerException("ERR unknown command 'FOO'"));
    assertFalse(other instanceof WardenNotLoadedException);
  }
}
