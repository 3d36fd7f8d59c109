package io.warden;

/** The per-thread side of the {@link DistributedLock} facade: hold counts over one server hold. */
final class ThreadHolds {
  private ThreadHolds() {}

  static final class Key {
    final Hold.Kind kind;
    final String key;
    final Thread thread;

    Key(Hold.Kind kind, String key, Thread thread) {
      this.kind = kind;
      this.key = key;
      this.thread = thread;
    }

    @Override
    public boolean equals(Object o) {
      if (!(o instanceof Key)) {
        return false;
      }
      Key k = (Key) o;
      return k.kind == kind && k.thread == thread && k.key.equals(key);
    }

    @Override
    public int hashCode() {
      return (kind.hashCode() * 31 + key.hashCode()) * 31 + System.identityHashCode(thread);
    }
  }

  /** One thread's hold: only that thread changes {@code count}. */
  static final class Entry {
    final Hold hold;
    int count = 1;

    Entry(Hold hold) {
      this.hold = hold;
    }
  }
}
