package io.warden.spring.boot;

import io.warden.Warden;
import io.warden.spring.integration.WardenLockRegistry;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.integration.support.locks.LockRegistry;

/**
 * A {@link WardenLockRegistry} ({@code warden.lock.registry-key}, {@code warden.lock.expire-after})
 * when Spring Integration 7 (Boot 4's) is on the class path and the application defines no {@link
 * LockRegistry}. Spring Integration 6 (Boot 3's) has no {@code DistributedLock}, which the
 * registry's locks are: there this backs off, and {@code warden.getLock(key)} is the lock to use.
 */
@AutoConfiguration(after = WardenAutoConfiguration.class)
@ConditionalOnClass(
    value = {LockRegistry.class, Warden.class},
    name = "org.springframework.integration.support.locks.DistributedLock")
@EnableConfigurationProperties(WardenProperties.class)
public final class WardenLockRegistryAutoConfiguration {
  @Bean
  @ConditionalOnBean(Warden.class)
  @ConditionalOnMissingBean(LockRegistry.class)
  WardenLockRegistry wardenLockRegistry(Warden warden, WardenProperties properties) {
    WardenProperties.Lock p = properties.getLock();
    return new WardenLockRegistry(warden, p.getRegistryKey(), p.getExpireAfter());
  }
}
