package io.warden.spring.boot3;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.resource.ClientResources;
import io.warden.Transport;
import io.warden.WaitConnection;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import io.warden.spring.boot.WardenCacheAutoConfiguration;
import io.warden.spring.boot.WardenLockRegistryAutoConfiguration;
import java.util.concurrent.CompletionStage;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.data.redis.RedisConnectionDetails;
import org.springframework.boot.autoconfigure.data.redis.RedisProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.connection.lettuce.LettuceClientConfiguration;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;

/**
 * On Spring Boot 3.x: the {@link Warden} that warden-spring's {@code WardenAutoConfiguration} makes
 * on Boot 4, from Boot 3's {@link RedisConnectionDetails} (Boot 4 renamed it {@code
 * DataRedisConnectionDetails} and moved it; the Boot 4 class backs off here, its class condition
 * unmet). Everything else (the Spring Cache, the properties) is warden-spring's own, which runs on
 * both. The same rules: one master (standalone or Sentinel's), the application's Lettuce client
 * configuration reused when it has a {@link LettuceConnectionFactory}, warden's own connections.
 */
@AutoConfiguration(
    afterName = "org.springframework.boot.autoconfigure.data.redis.RedisAutoConfiguration",
    before = {WardenCacheAutoConfiguration.class, WardenLockRegistryAutoConfiguration.class})
@ConditionalOnClass({
  Warden.class,
  LettuceTransport.class,
  RedisClient.class,
  RedisConnectionDetails.class,
  LettuceConnectionFactory.class
})
public final class WardenBoot3AutoConfiguration {
  @Bean(destroyMethod = "close")
  @ConditionalOnMissingBean
  @ConditionalOnBean(RedisConnectionDetails.class)
  Warden warden(
      RedisConnectionDetails details,
      ObjectProvider<RedisProperties> properties,
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

  private static LettuceClientConfiguration fromProperties(RedisProperties p) {
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

  static RedisURI uri(RedisConnectionDetails details, LettuceClientConfiguration client) {
    RedisURI.Builder b;
    RedisConnectionDetails.Sentinel sentinel = details.getSentinel();
    if (details.getCluster() != null) {
      throw new IllegalStateException(
          "warden's auto-configuration needs one master (spring.data.redis.host/port/url or"
              + " sentinel); for a cluster define a Warden bean");
    } else if (sentinel != null) {
      b = RedisURI.builder().withSentinelMasterId(sentinel.getMaster());
      for (RedisConnectionDetails.Node n : sentinel.getNodes()) {
        RedisURI.Builder node = RedisURI.builder().withHost(n.host()).withPort(n.port());
        authenticate(node, sentinel.getUsername(), sentinel.getPassword());
        b.withSentinel(node.build());
      }
      b.withDatabase(sentinel.getDatabase());
    } else {
      RedisConnectionDetails.Standalone standalone = details.getStandalone();
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
    if (client.isUseSsl()) {
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
        client.shutdown();
      }
    }
  }
}
