package io.warden.lettuce;

import io.warden.Transport;
import io.warden.testing.HostileUseSuite;
import io.warden.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;

/** Hostile and careless use through Lettuce. */
class LettuceHostileUseTest extends HostileUseSuite {
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
