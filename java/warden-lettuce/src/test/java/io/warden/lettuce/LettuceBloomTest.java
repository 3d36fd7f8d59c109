package io.warden.lettuce;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.warden.testing.RedisServer;
import java.util.Arrays;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** warden's BF.* through Lettuce's own Bloom filter API. */
@Tag("integration")
class LettuceBloomTest {
  @Test
  void lettucesBloomCommandsWorkOnWarden() {
    try (RedisServer server = RedisServer.start()) {
      RedisClient client = RedisClient.create(server.uri());
      try (StatefulRedisConnection<String, String> c = client.connect()) {
        RedisCommands<String, String> r = c.sync();
        assertEquals("OK", r.bfReserve("users", 0.01, 1000));
        assertTrue(r.bfAdd("users", "alice"));
        assertFalse(r.bfAdd("users", "alice"));
        assertEquals(Arrays.asList(true, false), r.bfMAdd("users", "bob", "alice"));
        assertTrue(r.bfExists("users", "bob"));
        assertFalse(r.bfExists("users", "carol"));
        assertEquals(2L, r.bfCard("users"));
        assertEquals(1000L, r.bfInfo("users").getCapacity());
      } finally {
        client.shutdown();
      }
    }
  }
}
