package io.warden.testing;

import io.warden.Transport;
import io.warden.Warden;
import java.lang.reflect.Method;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.TestInstance;

/**
 * A suite run once per transport: one real server for the class, a fresh {@link Warden} per test,
 * and keys prefixed with the test's name so that tests never share one.
 */
@Tag("integration")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
public abstract class TransportSuite {
  protected RedisServer server;
  protected Warden warden;
  private String prefix;

  /** A transport to {@code server} with its default settings. */
  protected abstract Transport transport(RedisServer server);

  @BeforeAll
  void startServer() {
    server = RedisServer.start();
  }

  @AfterAll
  void stopServer() {
    if (server != null) {
      server.close();
    }
  }

  @BeforeEach
  void open(TestInfo info) {
    warden = Warden.create(transport(server));
    prefix = info.getTestMethod().map(Method::getName).orElse("t") + ":";
  }

  @AfterEach
  void closeWarden() {
    warden.close();
  }

  protected String key(String name) {
    return prefix + name;
  }

  protected static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      throw new AssertionError(e);
    }
  }
}
