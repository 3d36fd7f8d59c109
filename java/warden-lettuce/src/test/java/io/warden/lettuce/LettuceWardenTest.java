package io.warden.lettuce;

import io.lettuce.core.RedisClient;
import io.warden.Transport;
import io.warden.testing.RedisServer;
import io.warden.testing.WardenSuite;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;

/** The client's behaviour through Lettuce. */
class LettuceWardenTest extends WardenSuite {
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
