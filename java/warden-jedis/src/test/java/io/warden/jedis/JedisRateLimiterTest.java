package io.warden.jedis;

import io.warden.Transport;
import io.warden.testing.RateLimiterSuite;
import io.warden.testing.RedisServer;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;

/** The rate limiter through Jedis. */
class JedisRateLimiterTest extends RateLimiterSuite {
  @Override
  protected Transport transport(RedisServer server) {
    return JedisTransport.create(
        new HostAndPort(server.host(), server.port()), DefaultJedisClientConfig.builder().build());
  }
}
