package io.warden.jedis;

import io.warden.Transport;
import io.warden.testing.NearCacheSuite;
import io.warden.testing.RedisServer;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;

/**
 * The near cache through Jedis (a RESP3 connection and its push consumers). {@link JedisTransport}
 * connects to one server and does not follow Sentinel: the Sentinel failover checker is skipped.
 */
class JedisNearCacheTest extends NearCacheSuite {
  @Override
  protected Transport transport(RedisServer server) {
    return JedisTransport.create(
        new HostAndPort(server.host(), server.port()), DefaultJedisClientConfig.builder().build());
  }
}
