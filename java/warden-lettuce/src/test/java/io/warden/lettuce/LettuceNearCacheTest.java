package io.warden.lettuce;

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

  @AfterAll
  void shutdownClients() {
    clients.close();
  }
}
