package io.warden.lettuce;

import io.lettuce.core.RedisURI;
import io.warden.Transport;
import io.warden.testing.NearCacheSuite;
import io.warden.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;

/** The near cache through Lettuce (its RESP3 push listener). */
class LettuceNearCacheTest extends NearCacheSuite {
  private final LettuceClients clients = new LettuceClients();

  @Override
  protected Transport transport(RedisServer server) {
    return clients.transport(server);
  }

  @Override
  protected Transport sentinelTransport(RedisServer sentinel, String name) {
    return clients.transport(
        RedisURI.Builder.sentinel(sentinel.host(), sentinel.port(), name).build());
  }

  @AfterAll
  void shutdownClients() {
    clients.close();
  }
}
