package io.warden;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

class NearStoreTest {
  private static byte[] v(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void keysWithALoneSurrogateAreNotWellFormed() {
    // Sent as UTF-8, such a key names another string: a near cache never keeps it.
    assertTrue(NearCache.wellFormed("product:42"));
    assertTrue(NearCache.wellFormed("emoji:\uD83D\uDE00"));
    assertFalse(NearCache.wellFormed("lone\uD800"));
    assertFalse(NearCache.wellFormed("\uDC00x"));
    assertFalse(NearCache.wellFormed("end\uD83D"));
  }

  @Test
  void aReplyIsKeptWhenNothingMovedItsKey() {
    NearStore s = new NearStore(10, 1000);
    long g = s.begin("k");
    assertTrue(s.end("k", g, v("1"), -1, 0));
    assertArrayEquals(v("1"), s.get("k", 0));
  }

  @Test
  void anInvalidationDuringTheReadDropsItsReply() {
    NearStore s = new NearStore(10, 1000);
    long g = s.begin("k");
    s.invalidate("k", true);
    assertFalse(s.end("k", g, v("old"), -1, 0));
    assertNull(s.get("k", 0));
  }

  @Test
  void aReadBegunAfterTheInvalidationKeepsItsReply() {
    NearStore s = new NearStore(10, 1000);
    long first = s.begin("k");
    s.invalidate("k", true);
    long second = s.begin("k");
    assertFalse(s.end("k", first, v("old"), -1, 0));
    assertTrue(s.end("k", second, v("new"), -1, 0));
    assertArrayEquals(v("new"), s.get("k", 0));
  }

  @Test
  void anotherKeysInvalidationDoesNotDropTheReply() {
    NearStore s = new NearStore(10, 1000);
    long g = s.begin("k");
    s.invalidate("other", true);
    assertTrue(s.end("k", g, v("1"), -1, 0));
  }

  @Test
  void aFlushDuringTheReadDropsItsReply() {
    NearStore s = new NearStore(10, 1000);
    long g = s.begin("k");
    s.flush();
    assertFalse(s.end("k", g, v("old"), -1, 0));
    assertEquals(1, s.counts()[5]);
  }

  @Test
  void aValueEndsAtItsExpiry() {
    NearStore s = new NearStore(10, 1000);
    assertTrue(s.end("k", s.begin("k"), v("1"), 100, 50));
    assertArrayEquals(v("1"), s.get("k", 99));
    assertNull(s.get("k", 100));
    assertFalse(s.end("k", s.begin("k"), v("1"), 100, 100));
  }

  @Test
  void theLeastRecentlyUsedGoFirstPastEitherBound() {
    NearStore byCount = new NearStore(2, 1000);
    byCount.end("a", byCount.begin("a"), v("1"), -1, 0);
    byCount.end("b", byCount.begin("b"), v("2"), -1, 0);
    byCount.get("a", 0);
    byCount.end("c", byCount.begin("c"), v("3"), -1, 0);
    assertNull(byCount.get("b", 0));
    assertArrayEquals(v("1"), byCount.get("a", 0));

    NearStore byBytes = new NearStore(100, 10);
    byBytes.end("a", byBytes.begin("a"), v("12345"), -1, 0);
    byBytes.end("b", byBytes.begin("b"), v("12345"), -1, 0);
    byBytes.end("c", byBytes.begin("c"), v("123"), -1, 0);
    assertNull(byBytes.get("a", 0));
    assertEquals(8, byBytes.counts()[1]);
    assertFalse(byBytes.end("big", byBytes.begin("big"), v("12345678901"), -1, 0));
  }
}
