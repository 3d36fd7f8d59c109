package io.warden.lettuce;

import io.warden.Transport;
import io.warden.testing.RateLimiterSuite;
import io.warden.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;

/** The rate limiter through Lettuce. */
class LettuceRateLimiterTest extends RateLimiterSuite {
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
