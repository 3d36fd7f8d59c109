package io.warden.lettuce;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.warden.Transport;
import io.warden.testing.RedisServer;
import java.util.ArrayList;
import java.util.List;

/** The Lettuce clients a suite's transports are made on, shut down together at its end. */
final class LettuceClients implements AutoCloseable {
  private final List<RedisClient> clients = new ArrayList<>();

  /** A transport on a new client of {@code server}, with Lettuce's defaults. */
  Transport transport(RedisServer server) {
    RedisClient client = RedisClient.create(server.uri());
    clients.add(client);
    return LettuceTransport.create(client);
  }

  /** A transport on a new client of {@code uri} (a Sentinel URI too), with Lettuce's defaults. */
  Transport transport(RedisURI uri) {
    RedisClient client = RedisClient.create(uri);
    clients.add(client);
    return LettuceTransport.create(client);
  }

  @Override
  public void close() {
    for (RedisClient c : clients) {
      c.shutdown();
    }
    clients.clear();
  }
}
