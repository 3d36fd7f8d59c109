package io.warden.jedis;

import io.warden.Transport;
import io.warden.WaitConnection;
import java.util.concurrent.CompletionStage;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.UnifiedJedis;

/** warden's {@link Transport} on Jedis. */
public final class JedisTransport implements Transport {
  private JedisTransport() {}

  public static JedisTransport create(UnifiedJedis shared) {
    throw new UnsupportedOperationException();
  }

  public static JedisTransport create(HostAndPort address, JedisClientConfig config) {
    throw new UnsupportedOperationException();
  }

  @Override
  public CompletionStage<Object> execute(byte[]... args) {
    throw new UnsupportedOperationException();
  }

  @Override
  public CompletionStage<WaitConnection> waitConnection(long deadlineNanos) {
    throw new UnsupportedOperationException();
  }

  @Override
  public void close() {}
}
