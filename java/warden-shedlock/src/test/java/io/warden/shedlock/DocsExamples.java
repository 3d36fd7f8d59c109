package io.warden.shedlock;

import io.warden.Warden;
import java.time.Duration;
import java.time.Instant;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.core.LockingTaskExecutor;

/** The code of docs/clients/java-shedlock.md, word for word ({@link DocsSnippetsTest}). */
final class DocsExamples {
  private DocsExamples() {}

  static int reports;

  static void sendReport() {
    reports++;
  }

  static void run(Warden warden) {
    // docs:begin executor
    LockProvider lockProvider = new WardenLockProvider(warden); // keys "shedlock:<name>"
    LockingTaskExecutor executor = new DefaultLockingTaskExecutor(lockProvider);
    executor.executeWithLock(
        (Runnable) () -> sendReport(),
        new LockConfiguration(
            Instant.now(), "nightly-report", Duration.ofMinutes(10), Duration.ofMinutes(1)));
    // docs:end
  }
}
