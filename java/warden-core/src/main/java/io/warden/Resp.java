package io.warden;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;

/** Reply and argument helpers. */
final class Resp {
  private Resp() {}

  static byte[] b(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static byte[] b(long n) {
    return b(Long.toString(n));
  }

  static byte[][] args(Object... parts) {
    byte[][] out = new byte[parts.length][];
    for (int i = 0; i < parts.length; i++) {
      Object p = parts[i];
      out[i] = p instanceof byte[] ? (byte[]) p : b(String.valueOf(p));
    }
    return out;
  }

  static String str(Object reply) {
    if (reply == null) {
      return null;
    }
    if (reply instanceof byte[]) {
      return new String((byte[]) reply, StandardCharsets.UTF_8);
    }
    return reply.toString();
  }

  /** An integer reply ({@code null} for nil); a bulk holding digits is read too. */
  static Long asLong(Object reply) {
    if (reply == null) {
      return null;
    }
    if (reply instanceof Long) {
      return (Long) reply;
    }
    if (reply instanceof Number) {
      return ((Number) reply).longValue();
    }
    return Long.parseLong(str(reply));
  }

  @SuppressWarnings("unchecked")
  static List<Object> asList(Object reply) {
    return (List<Object>) reply;
  }

  /** The field's value in a flat field/value reply (RESP2 array, or a RESP3 map flattened). */
  static Object field(Object reply, String name) {
    if (reply == null) {
      return null;
    }
    List<Object> l = asList(reply);
    for (int i = 0; i + 1 < l.size(); i += 2) {
      if (name.equals(str(l.get(i)))) {
        return l.get(i + 1);
      }
    }
    return null;
  }

  /** The cause an async stage failed with, warden's exceptions mapped (the not-loaded hint). */
  static Throwable unwrap(Throwable t) {
    while ((t instanceof CompletionException || t instanceof ExecutionException)
        && t.getCause() != null) {
      t = t.getCause();
    }
    if (t instanceof WardenServerException && !(t instanceof WardenNotLoadedException)) {
      String m = t.getMessage() == null ? "" : t.getMessage();
      String lower = m.toLowerCase(java.util.Locale.ROOT);
      if (lower.startsWith("err unknown command")
          && (lower.contains("'lock.")
              || lower.contains("'rwlock.")
              || lower.contains("'sem.")
              || lower.contains("'rate.")
              || lower.contains("'cache.")
              || lower.contains("'warden."))) {
        return new WardenNotLoadedException(m);
      }
    }
    return t;
  }

  /** Rethrows an async failure as an unchecked exception (warden's own when it is one). */
  static RuntimeException rethrow(Throwable t) {
    Throwable c = unwrap(t);
    if (c instanceof RuntimeException) {
      return (RuntimeException) c;
    }
    if (c instanceof Error) {
      throw (Error) c;
    }
    return new WardenException(String.valueOf(c.getMessage()), c);
  }
}
