package io.warden.lettuce;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.warden.Transport;
import io.warden.WaitConnection;
import java.util.concurrent.CompletionStage;

/** warden's {@link Transport} on Lettuce. */
public final class LettuceTransport implements Transport {
  private LettuceTransport() {}

  public static LettuceTransport create(RedisClient client) {
    throw new UnsupportedOperationException();
  }

  public static LettuceTransport create(
      RedisClient client, StatefulRedisConnection<byte[], byte[]> shared) {
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
