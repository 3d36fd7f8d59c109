package io.warden.bench;

import java.util.Iterator;
import java.util.List;
import java.util.Map;

/** Writes maps, lists, numbers, strings, booleans and null as indented JSON. */
final class Json {
  private Json() {}

  static String write(Object value) {
    StringBuilder out = new StringBuilder();
    write(out, value, "");
    return out.append('\n').toString();
  }

  private static void write(StringBuilder out, Object v, String indent) {
    if (v == null) {
      out.append("null");
    } else if (v instanceof Map<?, ?> map) {
      out.append("{");
      Iterator<? extends Map.Entry<?, ?>> it = map.entrySet().iterator();
      while (it.hasNext()) {
        Map.Entry<?, ?> e = it.next();
        out.append('\n').append(indent).append("  ");
        string(out, String.valueOf(e.getKey()));
        out.append(": ");
        write(out, e.getValue(), indent + "  ");
        out.append(it.hasNext() ? "," : "\n" + indent);
      }
      out.append("}");
    } else if (v instanceof List<?> list) {
      out.append("[");
      for (int i = 0; i < list.size(); i++) {
        out.append(i == 0 ? "" : ", ");
        write(out, list.get(i), indent);
      }
      out.append("]");
    } else if (v instanceof Double d) {
      out.append(d.isNaN() || d.isInfinite() ? "null" : String.format("%.6g", d));
    } else if (v instanceof Number || v instanceof Boolean) {
      out.append(v);
    } else {
      string(out, v.toString());
    }
  }

  private static void string(StringBuilder out, String s) {
    out.append('"');
    for (char c : s.toCharArray()) {
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }
}
