package io.warden.spring.boot;

import org.springframework.boot.autoconfigure.condition.ConditionOutcome;
import org.springframework.boot.autoconfigure.condition.SpringBootCondition;
import org.springframework.context.annotation.ConditionContext;
import org.springframework.core.type.AnnotatedTypeMetadata;

/** {@code spring.cache.type} is {@code warden} or not set (another type: the user chose it). */
class WardenCacheCondition extends SpringBootCondition {
  @Override
  public ConditionOutcome getMatchOutcome(
      ConditionContext context, AnnotatedTypeMetadata metadata) {
    String type = context.getEnvironment().getProperty("spring.cache.type");
    if (type == null || type.isBlank()) {
      return ConditionOutcome.match("spring.cache.type is not set");
    }
    if (type.trim().equalsIgnoreCase("warden")) {
      return ConditionOutcome.match("spring.cache.type is warden");
    }
    return ConditionOutcome.noMatch("spring.cache.type is " + type);
  }
}
