package io.warden.testing;

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * A minimal RESP2 connection for tests' own commands (INFO, LOCK.INFO, CLIENT LIST...), independent
 * of the transports under test. Replies: integer {@code Long}, bulk {@code byte[]}, status {@code
 * String}, array {@code List<Object>}, nil {@code null}; an error reply throws {@link RespError}.
 */
public final class RespClient implements AutoCloseable {
  /** An error reply. */
  public static final class RespError extends RuntimeException {
    private static final long serialVersionUID = 1L;

    RespError(String message) {
      super(message);
    }
  }

  private final Socket socket;
  private final InputStream in;
  private final OutputStream out;

  public RespClient(String host, int port) throws IOException {
    socket = new Socket(host, port);
    socket.setTcpNoDelay(true);
    socket.setSoTimeout(30_000);
    in = new BufferedInputStream(socket.getInputStream());
    out = socket.getOutputStream();
  }

  /** Sends one command (arguments: {@code byte[]} or anything's {@code toString()}). */
  public void send(Object... args) throws IOException {
    ByteArrayOutputStream b = new ByteArrayOutputStream();
    b.write(("*" + args.length + "\r\n").getBytes(StandardCharsets.UTF_8));
    for (Object a : args) {
      byte[] bytes =
          a instanceof byte[] ? (byte[]) a : a.toString().getBytes(StandardCharsets.UTF_8);
      b.write(("$" + bytes.length + "\r\n").getBytes(StandardCharsets.UTF_8));
      b.write(bytes);
      b.write("\r\n".getBytes(StandardCharsets.UTF_8));
    }
    out.write(b.toByteArray());
    out.flush();
  }

  /** Reads one reply. */
  public Object read() throws IOException {
    int type = in.read();
    if (type < 0) {
      throw new IOException("connection closed");
    }
    String line = line();
    switch (type) {
      case '+':
        return line;
      case '-':
        throw new RespError(line);
      case ':':
        return Long.parseLong(line);
      case '$':
        {
          int n = Integer.parseInt(line);
          if (n < 0) {
            return null;
          }
          byte[] data = new byte[n];
          int off = 0;
          while (off < n) {
            int r = in.read(data, off, n - off);
            if (r < 0) {
              throw new IOException("connection closed");
            }
            off += r;
          }
          line();
          return data;
        }
      case '*':
        {
          int n = Integer.parseInt(line);
          if (n < 0) {
            return null;
          }
          List<Object> list = new ArrayList<>(n);
          for (int i = 0; i < n; i++) {
            try {
              list.add(read());
            } catch (RespError e) {
              list.add(e);
            }
          }
          return list;
        }
      default:
        throw new IOException("unexpected reply type " + (char) type);
    }
  }

  private String line() throws IOException {
    ByteArrayOutputStream b = new ByteArrayOutputStream();
    int c;
    while ((c = in.read()) != '\r') {
      if (c < 0) {
        throw new IOException("connection closed");
      }
      b.write(c);
    }
    in.read();
    return new String(b.toByteArray(), StandardCharsets.UTF_8);
  }

  /** Sends one command and reads its reply. */
  public Object call(Object... args) throws IOException {
    send(args);
    return read();
  }

  /** Sets the read timeout of this connection. */
  public void readTimeout(int millis) throws IOException {
    socket.setSoTimeout(millis);
  }

  @Override
  public void close() {
    try {
      socket.close();
    } catch (IOException e) {
      // closing
    }
  }
}
