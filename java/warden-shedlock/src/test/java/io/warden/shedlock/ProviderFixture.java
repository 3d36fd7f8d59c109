package io.warden.shedlock;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import io.warden.testing.RedisServer;

/** A real server, a Warden on Lettuce and the provider on it, closed together. */
final class ProviderFixture implements AutoCloseable {
  final RedisServer server = RedisServer.start();
  final RedisClient client = RedisClient.create(server.uri());
  final Warden warden = Warden.create(LettuceTransport.create(client));
  final WardenLockProvider provider = new WardenLockProvider(warden);

  @Override
  public void close() {
    warden.close();
    client.shutdown();
    server.close();
  }
}
