package io.warden.jedis;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.warden.testing.RedisServer;
import java.util.Arrays;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.RedisClient;

/** warden's BF.* through Jedis' own Bloom filter API. */
@Tag("integration")
class JedisBloomTest {
  @Test
  void jedisBloomCommandsWorkOnWarden() {
    try (RedisServer server = RedisServer.start();
        RedisClient r = RedisClient.create(server.host(), server.port())) {
      assertEquals("OK", r.bfReserve("users", 0.01, 1000));
      assertTrue(r.bfAdd("users", "alice"));
      assertFalse(r.bfAdd("users", "alice"));
      assertEquals(Arrays.asList(true, false), r.bfMAdd("users", "bob", "alice"));
      assertTrue(r.bfExists("users", "bob"));
      assertFalse(r.bfExists("users", "carol"));
      assertEquals(2L, r.bfCard("users"));
    }
  }
}
