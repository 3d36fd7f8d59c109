package io.warden.spring.boot;

import io.warden.spring.cache.WardenCacheManager;

/**
 * Changes the auto-configured {@link WardenCacheManager} before it is built (per-cache TTLs...).
 */
@FunctionalInterface
public interface WardenCacheManagerBuilderCustomizer {
  void customize(WardenCacheManager.Builder builder);
}
