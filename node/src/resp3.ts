// The little of RESP3 the near cache's tracking connection speaks: commands
// out as arrays of bulk strings, replies and push messages in, parsed in the
// order the server sent them (ioredis has no RESP3; see docs/clients/node.md).

import { ReplyError } from "./errors.js";
import type { Args } from "./transport.js";

/** An out-of-band message (`>`): an invalidation, for the near cache. */
export class Push {
  constructor(readonly items: unknown[]) {}
}

/** A command as RESP: an array of bulk strings. */
export function encode(args: Args): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)];
  for (const arg of args) {
    const data = Buffer.from(String(arg));
    parts.push(Buffer.from(`$${data.length}\r\n`), data, Buffer.from("\r\n"));
  }
  return Buffer.concat(parts);
}

/** Not enough bytes yet for a whole frame. */
const INCOMPLETE: unique symbol = Symbol("incomplete");

/** Frames from a byte stream, chunk by chunk: replies (an error reply as a
 * `ReplyError` value), and `Push`es. */
export class Parser {
  private buffer: Buffer = Buffer.alloc(0);
  private offset = 0;

  /** The whole frames `chunk` completes, in order. */
  feed(chunk: Buffer): unknown[] {
    this.buffer =
      this.offset < this.buffer.length
        ? Buffer.concat([this.buffer.subarray(this.offset), chunk])
        : chunk;
    this.offset = 0;
    const frames: unknown[] = [];
    for (;;) {
      const start = this.offset;
      const frame = this.value();
      if (frame === INCOMPLETE) {
        this.offset = start;
        return frames;
      }
      frames.push(frame);
    }
  }

  private line(): string | typeof INCOMPLETE {
    const end = this.buffer.indexOf("\r\n", this.offset);
    if (end < 0) return INCOMPLETE;
    const text = this.buffer.toString("utf8", this.offset, end);
    this.offset = end + 2;
    return text;
  }

  private value(): unknown {
    if (this.offset >= this.buffer.length) return INCOMPLETE;
    const type = String.fromCharCode(this.buffer[this.offset] as number);
    this.offset += 1;
    const head = this.line();
    if (head === INCOMPLETE) return INCOMPLETE;
    switch (type) {
      case "+":
        return head;
      case "-":
        return new ReplyError(head);
      case ":":
        return Number(head);
      case "_":
        return null;
      case ",":
        return Number(head);
      case "#":
        return head === "t";
      case "(":
        return head;
      case "$":
      case "=":
      case "!": {
        const n = Number(head);
        if (n < 0) return null;
        if (this.offset + n + 2 > this.buffer.length) return INCOMPLETE;
        let text = this.buffer.toString("utf8", this.offset, this.offset + n);
        this.offset += n + 2;
        if (type === "=") text = text.slice(4); // "txt:" or "mkd:"
        return type === "!" ? new ReplyError(text) : text;
      }
      case "*":
      case "~":
      case ">": {
        const n = Number(head);
        if (n < 0) return null;
        const items: unknown[] = [];
        for (let i = 0; i < n; i++) {
          const item = this.value();
          if (item === INCOMPLETE) return INCOMPLETE;
          items.push(item);
        }
        return type === ">" ? new Push(items) : items;
      }
      case "%":
      case "|": {
        const map = new Map<unknown, unknown>();
        for (let i = 0; i < Number(head); i++) {
          const key = this.value();
          if (key === INCOMPLETE) return INCOMPLETE;
          const value = this.value();
          if (value === INCOMPLETE) return INCOMPLETE;
          map.set(key, value);
        }
        // An attribute annotates the value that follows: that value is the frame.
        return type === "|" ? this.value() : map;
      }
      default:
        throw new ReplyError(`unknown RESP type byte ${JSON.stringify(type)}`);
    }
  }
}
