package io.warden.spring.docs;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

/** Code blocks of a markdown page, and the marked regions of a source file they must equal. */
final class Snippets {
  private Snippets() {}

  /** The repository's root (java/ is one below it). */
  static Path root() {
    String javaRoot = System.getenv("WARDEN_JAVA_ROOT");
    Path java =
        javaRoot == null || javaRoot.isEmpty()
            ? Paths.get("..").toAbsolutePath()
            : Paths.get(javaRoot);
    return java.resolve("..").normalize();
  }

  /** The bodies of the {@code ```lang} blocks of {@code page}, in page order. */
  static List<String> blocks(Path page, String lang) throws IOException {
    List<String> blocks = new ArrayList<>();
    StringBuilder body = null;
    for (String line : Files.readAllLines(page, StandardCharsets.UTF_8)) {
      if (body == null) {
        if (line.trim().equals("```" + lang)) {
          body = new StringBuilder();
        }
      } else if (line.trim().equals("```")) {
        blocks.add(body.toString());
        body = null;
      } else {
        body.append(line).append('\n');
      }
    }
    return blocks;
  }

  /** The {@code // docs:begin NAME} ... {@code // docs:end} regions of {@code source}, dedented. */
  static List<String> regions(Path source) throws IOException {
    List<String> regions = new ArrayList<>();
    List<String> region = null;
    for (String line : Files.readAllLines(source, StandardCharsets.UTF_8)) {
      String t = line.trim();
      if (t.startsWith("// docs:begin")) {
        region = new ArrayList<>();
      } else if (t.equals("// docs:end")) {
        regions.add(dedent(region));
        region = null;
      } else if (region != null) {
        region.add(line);
      }
    }
    return regions;
  }

  private static String dedent(List<String> lines) {
    while (!lines.isEmpty() && lines.get(lines.size() - 1).isBlank()) {
      lines.remove(lines.size() - 1);
    }
    int indent = Integer.MAX_VALUE;
    for (String l : lines) {
      if (!l.isBlank()) {
        indent = Math.min(indent, l.length() - l.stripLeading().length());
      }
    }
    StringBuilder sb = new StringBuilder();
    for (String l : lines) {
      sb.append(l.isBlank() ? "" : l.substring(indent)).append('\n');
    }
    return sb.toString();
  }
}
