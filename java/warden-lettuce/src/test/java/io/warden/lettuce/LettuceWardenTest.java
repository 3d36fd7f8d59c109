package io.warden.lettuce;

import io.lettuce.core.RedisURI;
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

  @Override
  protected Transport transport(RedisServer server, String user, String password) {
    return clients.transport(
        RedisURI.builder()
            .withHost(server.host())
            .withPort(server.port())
            .withAuthentication(user, password)
            .build());
  }

  @AfterAll
  void shutdownClients() {
    clients.close();
  }
}
