package io.warden.spring.boot;

import io.warden.Warden;
import io.warden.spring.cache.WardenCacheConfiguration;
import io.warden.spring.cache.WardenCacheManager;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.cache.CacheManager;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Conditional;

/**
 * A {@link WardenCacheManager} when {@code spring.cache.type=warden}, or when {@code
 * spring.cache.type} is not set and the application defines no {@link CacheManager}. It runs before
 * Boot's cache auto-configuration, which then backs off.
 */
@AutoConfiguration(
    after = WardenAutoConfiguration.class,
    beforeName = "org.springframework.boot.cache.autoconfigure.CacheAutoConfiguration")
@ConditionalOnClass({CacheManager.class, Warden.class})
@EnableConfigurationProperties(WardenProperties.class)
public final class WardenCacheAutoConfiguration {
  @Bean
  @ConditionalOnBean(Warden.class)
  @ConditionalOnMissingBean(CacheManager.class)
  @Conditional(WardenCacheCondition.class)
  WardenCacheManager cacheManager(
      Warden warden,
      WardenProperties properties,
      ObjectProvider<WardenCacheManagerBuilderCustomizer> customizers) {
    WardenProperties.Cache p = properties.getCache();
    WardenCacheConfiguration defaults = WardenCacheConfiguration.defaultCacheConfig();
    if (p.getTimeToLive() != null) {
      defaults = defaults.entryTtl(p.getTimeToLive());
    }
    if (!p.isCacheNullValues()) {
      defaults = defaults.disableCachingNullValues();
    }
    if (!p.isUseKeyPrefix()) {
      defaults = defaults.disableKeyPrefix();
    } else if (p.getKeyPrefix() != null) {
      defaults = defaults.prefixCacheNameWith(p.getKeyPrefix());
    }
    WardenCacheManager.Builder builder = WardenCacheManager.builder(warden).cacheDefaults(defaults);
    if (!p.getCacheNames().isEmpty()) {
      builder.initialCacheNames(p.getCacheNames()).disableCreateOnMissingCache();
    }
    WardenCacheConfiguration base = defaults;
    p.getTimeToLiveByCache()
        .forEach((name, ttl) -> builder.withCacheConfiguration(name, base.entryTtl(ttl)));
    customizers.orderedStream().forEach(c -> c.customize(builder));
    return builder.build();
  }
}
