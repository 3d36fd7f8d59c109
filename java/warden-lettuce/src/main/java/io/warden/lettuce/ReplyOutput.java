package io.warden.lettuce;

import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.output.CommandOutput;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;

/**
 * Any reply as warden's {@link io.warden.Transport} maps it: integer {@code Long}, bulk {@code
 * byte[]}, simple string {@code String}, array {@code List<Object>} (a RESP3 map as a flat
 * field/value list), nil {@code null}.
 */
final class ReplyOutput extends CommandOutput<byte[], byte[], Object> {
  private static final class Frame {
    final List<Object> list;
    int left;

    Frame(List<Object> list, int left) {
      this.list = list;
      this.left = left;
    }
  }

  private final Deque<Frame> stack = new ArrayDeque<>();

  ReplyOutput() {
    super(ByteArrayCodec.INSTANCE, null);
  }

  private void add(Object v) {
    Frame top = stack.peek();
    if (top == null) {
      output = v;
      return;
    }
    top.list.add(v);
    // An array is done with its last element: pop it, and count it in its parent.
    while (top != null && --top.left == 0) {
      stack.pop();
      top = stack.peek();
    }
  }

  private static byte[] bytes(ByteBuffer b) {
    byte[] out = new byte[b.remaining()];
    b.duplicate().get(out);
    return out;
  }

  @Override
  public void set(ByteBuffer bytes) {
    add(bytes == null ? null : bytes(bytes));
  }

  @Override
  public void setSingle(ByteBuffer bytes) {
    add(bytes == null ? null : new String(bytes(bytes), StandardCharsets.UTF_8));
  }

  @Override
  public void setBigNumber(ByteBuffer bytes) {
    add(bytes == null ? null : new String(bytes(bytes), StandardCharsets.UTF_8));
  }

  @Override
  public void set(long integer) {
    add(integer);
  }

  @Override
  public void set(double number) {
    add(number);
  }

  @Override
  public void set(boolean value) {
    add(value ? 1L : 0L);
  }

  @Override
  public void multi(int count) {
    if (count < 0) {
      add(null);
      return;
    }
    List<Object> list = new ArrayList<>(count);
    if (stack.isEmpty() && output == null) {
      output = list;
      if (count > 0) {
        stack.push(new Frame(list, count));
      }
      return;
    }
    if (count == 0) {
      add(list);
      return;
    }
    // Placed in its parent now (order kept), counted there once it is complete.
    Frame parent = stack.peek();
    if (parent != null) {
      parent.list.add(list);
    }
    stack.push(new Frame(list, count));
  }
}
