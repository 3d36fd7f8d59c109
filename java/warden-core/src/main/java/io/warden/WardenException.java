package io.warden;

/** Base of warden's errors. */
public class WardenException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public WardenException(String message) {
    super(message);
  }

  public WardenException(String message, Throwable cause) {
    super(message, cause);
  }
}
