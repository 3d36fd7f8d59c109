package io.warden.lettuce;

import io.lettuce.core.RedisClient;
import io.warden.Transport;
import io.warden.testing.HostileUseSuite;
import io.warden.testing.RedisServer;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;

/** Hostile and careless use through Lettuce. */
class LettuceHostileUseTest extends HostileUseSuite {
  private final List<RedisClient> clients = new ArrayList<>();

  @Override
  protected Transport transport(RedisServer server) {
    RedisClient client = RedisClient.create(server.uri());
    clients.add(client);
    return LettuceTransport.create(client);
  }

  @AfterAll
  void shutdownClients() {
    for (RedisClient c : clients) {
      c.shutdown();
    }
  }
}
