package io.warden;

/** The server does not know warden's commands: the module is not loaded there. */
public class WardenNotLoadedException extends WardenServerException {
  private static final long serialVersionUID = 1L;

  public WardenNotLoadedException(String serverText) {
    super(
        serverText
            + " (is warden loaded? start the server with --loadmodule /path/to/libwarden.so)");
  }
}
