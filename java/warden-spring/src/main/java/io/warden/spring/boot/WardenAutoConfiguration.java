package io.warden.spring.boot;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.resource.ClientResources;
import io.warden.Transport;
import io.warden.WaitConnection;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import java.util.concurrent.CompletionStage;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.boot.data.redis.autoconfigure.DataRedisConnectionDetails;
import org.springframework.boot.data.redis.autoconfigure.DataRedisProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.connection.lettuce.LettuceClientConfiguration;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;

/**
 * A {@link Warden} built from the application's {@code spring.data.redis.*} settings.
 *
 * <p>What it reuses: the server's address, database and credentials from Boot's {@link
 * DataRedisConnectionDetails} (so Docker Compose and Testcontainers service connections work too);
 * from the application's {@link LettuceConnectionFactory}, when there is one, its {@link
 * LettuceClientConfiguration}: the {@link ClientResources} (event loops, shared, not shut down by
 * warden), the {@code ClientOptions} (SSL bundle, connect timeout, ...), SSL/StartTLS/peer
 * verification, the command timeout and the client name. Without a Lettuce connection factory (a
 * Jedis application) those come from {@code spring.data.redis.timeout}, {@code client-name} and
 * {@code ssl.enabled}. warden opens its own connections (a shared one, and dedicated ones for
 * blocking waits) on its own {@link RedisClient}: it never borrows the application's, so a blocking
 * wait never stalls a {@code RedisTemplate}.
 *
 * <p>One master is supported (standalone, or Sentinel's master); {@code spring.data.redis.cluster}
 * and static master/replica setups are refused with a message: define a {@link Warden} bean there.
 */
@AutoConfiguration(
    afterName = "org.springframework.boot.data.redis.autoconfigure.DataRedisAutoConfiguration")
@ConditionalOnClass({
  Warden.class,
  LettuceTransport.class,
  RedisClient.class,
  DataRedisConnectionDetails.class,
  LettuceConnectionFactory.class
})
@EnableConfigurationProperties(WardenProperties.class)
public final class WardenAutoConfiguration {
  @Bean(destroyMethod = "close")
  @ConditionalOnMissingBean
  @ConditionalOnBean(DataRedisConnectionDetails.class)
  Warden warden(
      DataRedisConnectionDetails details,
      ObjectProvider<DataRedisProperties> properties,
      ObjectProvider<RedisConnectionFactory> connectionFactory) {
    LettuceClientConfiguration client =
        connectionFactory.getIfUnique() instanceof LettuceConnectionFactory lettuce
            ? lettuce.getClientConfiguration()
            : fromProperties(properties.getIfAvailable());
    RedisURI uri = uri(details, client);
    ClientResources resources = client.getClientResources().orElse(null);
    RedisClient redis =
        resources == null ? RedisClient.create(uri) : RedisClient.create(resources, uri);
    client.getClientOptions().ifPresent(redis::setOptions);
    return Warden.create(new OwningTransport(LettuceTransport.create(redis), redis));
  }

  private static LettuceClientConfiguration fromProperties(DataRedisProperties p) {
    LettuceClientConfiguration.LettuceClientConfigurationBuilder b =
        LettuceClientConfiguration.builder();
    if (p != null) {
      if (p.getTimeout() != null) {
        b.commandTimeout(p.getTimeout());
      }
      if (p.getClientName() != null && !p.getClientName().isEmpty()) {
        b.clientName(p.getClientName());
      }
      if (p.getSsl().isEnabled()) {
        b.useSsl();
      }
    }
    return b.build();
  }

  static RedisURI uri(DataRedisConnectionDetails details, LettuceClientConfiguration client) {
    RedisURI.Builder b;
    DataRedisConnectionDetails.Sentinel sentinel = details.getSentinel();
    if (details.getCluster() != null || details.getMasterReplica() != null) {
      throw new IllegalStateException(
          "warden's auto-configuration needs one master (spring.data.redis.host/port/url or"
              + " sentinel); for a cluster or a static master/replica setup define a Warden bean");
    } else if (sentinel != null) {
      b = RedisURI.builder().withSentinelMasterId(sentinel.getMaster());
      for (DataRedisConnectionDetails.Node n : sentinel.getNodes()) {
        // The sentinels' own credentials go on each sentinel's URI.
        RedisURI.Builder node = RedisURI.builder().withHost(n.host()).withPort(n.port());
        authenticate(node, sentinel.getUsername(), sentinel.getPassword());
        b.withSentinel(node.build());
      }
      b.withDatabase(sentinel.getDatabase());
    } else {
      DataRedisConnectionDetails.Standalone standalone = details.getStandalone();
      if (standalone == null) {
        throw new IllegalStateException("spring.data.redis names no server");
      }
      b =
          RedisURI.builder()
              .withHost(standalone.getHost())
              .withPort(standalone.getPort())
              .withDatabase(standalone.getDatabase());
    }
    authenticate(b, details.getUsername(), details.getPassword());
    if (client.isUseSsl() || details.getSslBundle() != null) {
      b.withSsl(true).withStartTls(client.isStartTls()).withVerifyPeer(client.getVerifyMode());
    }
    client.getClientName().ifPresent(b::withClientName);
    b.withTimeout(client.getCommandTimeout());
    return b.build();
  }

  private static void authenticate(RedisURI.Builder b, String username, String password) {
    if (password == null) {
      return;
    }
    if (username == null) {
      b.withPassword(password.toCharArray());
    } else {
      b.withAuthentication(username, password.toCharArray());
    }
  }

  /** The transport of a {@link RedisClient} made here: closing it shuts the client down too. */
  static final class OwningTransport implements Transport {
    private final Transport transport;
    private final RedisClient client;

    OwningTransport(Transport transport, RedisClient client) {
      this.transport = transport;
      this.client = client;
    }

    @Override
    public CompletionStage<Object> execute(byte[]... args) {
      return transport.execute(args);
    }

    @Override
    public CompletionStage<WaitConnection> waitConnection(long deadlineNanos) {
      return transport.waitConnection(deadlineNanos);
    }

    @Override
    public void close() {
      try {
        transport.close();
      } finally {
        // Shared ClientResources (Boot's bean) survive this: Lettuce shuts down only its own.
        client.shutdown();
      }
    }
  }
}
