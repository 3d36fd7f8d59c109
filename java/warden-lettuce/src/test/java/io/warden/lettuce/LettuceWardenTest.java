package io.warden.lettuce;

import io.warden.Transport;
import io.warden.testing.RedisServer;
import io.warden.testing.WardenSuite;
import org.junit.jupiter.api.AfterAll;

/** The client's behaviour through Lettuce. */
class LettuceWardenTest extends WardenSuite {
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
