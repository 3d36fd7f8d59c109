package io.warden.shedlock;

import static org.assertj.core.api.Assertions.assertThat;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import io.warden.testing.RedisServer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** docs/clients/java-shedlock.md: its Java block is {@link DocsExamples}' code, run here. */
@Tag("integration")
class DocsSnippetsTest {
  private static Path root() {
    String javaRoot = System.getenv("WARDEN_JAVA_ROOT");
    Path java =
        javaRoot == null || javaRoot.isEmpty()
            ? Paths.get("..").toAbsolutePath()
            : Paths.get(javaRoot);
    return java.resolve("..").normalize();
  }

  /** The lines between {@code // docs:begin} and {@code // docs:end}, dedented. */
  private static String region(Path source) throws Exception {
    List<String> lines = new ArrayList<>();
    boolean in = false;
    for (String line : Files.readAllLines(source, StandardCharsets.UTF_8)) {
      if (line.trim().startsWith("// docs:begin")) {
        in = true;
      } else if (line.trim().equals("// docs:end")) {
        in = false;
      } else if (in) {
        lines.add(line);
      }
    }
    int indent =
        lines.stream()
            .filter(l -> !l.isBlank())
            .mapToInt(l -> l.length() - l.stripLeading().length())
            .min()
            .orElse(0);
    StringBuilder sb = new StringBuilder();
    lines.forEach(l -> sb.append(l.isBlank() ? "" : l.substring(indent)).append('\n'));
    return sb.toString();
  }

  private static String javaBlock(Path page) throws Exception {
    StringBuilder sb = null;
    for (String line : Files.readAllLines(page, StandardCharsets.UTF_8)) {
      if (sb == null && line.trim().equals("```java")) {
        sb = new StringBuilder();
      } else if (sb != null && line.trim().equals("```")) {
        return sb.toString();
      } else if (sb != null) {
        sb.append(line).append('\n');
      }
    }
    throw new AssertionError("no java block in " + page);
  }

  @Test
  void theJavaBlockOfThePageIsExampleCodeAndRuns() throws Exception {
    assertThat(javaBlock(root().resolve("docs/clients/java-shedlock.md")))
        .isEqualTo(region(Paths.get("src/test/java/io/warden/shedlock/DocsExamples.java")));
    try (RedisServer server = RedisServer.start()) {
      RedisClient client = RedisClient.create(server.uri());
      try (Warden warden = Warden.create(LettuceTransport.create(client))) {
        DocsExamples.run(warden);
        assertThat(DocsExamples.reports).isEqualTo(1);
        // lockAtLeastFor: the lock stays for the rest of its minute after the task.
        assertThat((Long) server.call("PTTL", "shedlock:nightly-report")).isBetween(1L, 60_000L);
        DocsExamples.run(warden);
        assertThat(DocsExamples.reports).isEqualTo(1);
      } finally {
        client.shutdown();
      }
    }
  }
}
