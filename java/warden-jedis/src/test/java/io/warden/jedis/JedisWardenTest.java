package io.warden.jedis;

import io.warden.Transport;
import io.warden.testing.RedisServer;
import io.warden.testing.WardenSuite;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;

/** The client's behaviour through Jedis. */
class JedisWardenTest extends WardenSuite {
  @Override
  protected Transport transport(RedisServer server) {
    return JedisTransport.create(
        new HostAndPort(server.host(), server.port()), DefaultJedisClientConfig.builder().build());
  }

  @Override
  protected Transport transport(RedisServer server, String user, String password) {
    return JedisTransport.create(
        new HostAndPort(server.host(), server.port()),
        DefaultJedisClientConfig.builder().user(user).password(password).build());
  }
}
