// Cache keys of a wrapped function's calls: one injective text per argument
// list, so that no two different calls share a key (1 and "1", null and
// undefined, [1, 2] and "1,2", {a: 1, b: 2} and {b: 2, a: 1} in any order
// being the same object).

function encode(value: unknown, seen: Set<object>): string {
  switch (typeof value) {
    case "undefined":
      return "u";
    case "boolean":
      return value ? "t" : "f";
    case "number":
      return Object.is(value, -0) ? "n-0" : `n${value}`;
    case "bigint":
      return `b${value}`;
    case "string":
      return `s${JSON.stringify(value)}`;
    case "object": {
      if (value === null) return "z";
      if (seen.has(value)) throw new TypeError("a cache key argument refers to itself");
      if (value instanceof Date) return `D${value.toISOString()}`;
      if (Buffer.isBuffer(value)) return `B${value.toString("base64")}`;
      seen.add(value);
      try {
        if (Array.isArray(value)) return `[${value.map((v) => encode(v, seen)).join(",")}]`;
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          throw new TypeError(
            "cache key arguments are primitives, arrays, plain objects, Dates and Buffers: give `key` for others",
          );
        }
        const entries = Object.keys(value)
          .sort()
          .map(
            (k) => `${JSON.stringify(k)}:${encode((value as Record<string, unknown>)[k], seen)}`,
          );
        return `{${entries.join(",")}}`;
      } finally {
        seen.delete(value);
      }
    }
    default:
      throw new TypeError(`a ${typeof value} cannot be part of a cache key: give \`key\``);
  }
}

/** The key of one call: `name` and its arguments, encoded without collisions. */
export function callKey(name: string, args: readonly unknown[]): string {
  return `${name}:${encode(args, new Set())}`;
}
