package io.warden.jedis;

import io.warden.Transport;
import io.warden.testing.HostileUseSuite;
import io.warden.testing.RedisServer;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;

/** Hostile and careless use through Jedis. */
class JedisHostileUseTest extends HostileUseSuite {
  @Override
  protected Transport transport(RedisServer server) {
    return JedisTransport.create(
        new HostAndPort(server.host(), server.port()), DefaultJedisClientConfig.builder().build());
  }

  // 10,000 virtual threads on Jedis' shared pool (commons-pool2, 8 connections) make no progress
  // in minutes: its create() loop spins under a monitor. That is the pool's, not warden's waits;
  // Lettuce runs the full 10,000.
  @Override
  protected int virtualThreads() {
    return 1_000;
  }
}
