package io.warden;

/**
 * An error reply of the server, its text unchanged (a {@code WRONGTYPE ...} stays one: it is not
 * turned into "could not acquire").
 */
public class WardenServerException extends WardenException {
  private static final long serialVersionUID = 1L;

  public WardenServerException(String message) {
    super(message);
  }

  public WardenServerException(String message, Throwable cause) {
    super(message, cause);
  }

  /** The error code, the first word of the server's text ({@code ERR}, {@code WRONGTYPE}...). */
  public String code() {
    String m = getMessage() == null ? "" : getMessage();
    int sp = m.indexOf(' ');
    return sp < 0 ? m : m.substring(0, sp);
  }
}
