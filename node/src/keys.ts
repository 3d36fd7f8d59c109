// Keys: those of a wrapped function's calls, one injective text per argument
// list, so that no two different calls share a key (1 and "1", null and
// undefined, [1, 2] and "1,2", {a: 1, b: 2} and {b: 2, a: 1} in any order
// being the same object); and the checks of a key (and the options that go
// with it) a caller passes.

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

/** What a wrong argument was, for its error. */
function what(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return typeof value === "object" ? "an object" : `${typeof value} ${String(value)}`;
}

/** A key the caller gave: a string. Anything else would still name a key
 * (`undefined`, `null` and `{}` become "undefined", "null" and
 * "[object Object]"): refused before anything is sent. */
export function checkKey(key: unknown, name = "key"): string {
  if (typeof key !== "string") throw new TypeError(`${name} must be a string, not ${what(key)}`);
  return key;
}

/** `watchdog`: true, false or not given. */
export function checkFlag(name: string, value: unknown): boolean | undefined {
  if (value !== undefined && typeof value !== "boolean") {
    throw new TypeError(`${name} must be true or false, not ${what(value)}`);
  }
  return value;
}

/** `signal`: an AbortSignal (or anything shaped like one) or not given;
 * checked before a request is sent, not when its wait first listens to it. */
export function checkSignal(signal: unknown): AbortSignal | undefined {
  if (signal === undefined) return undefined;
  const s = signal as { aborted?: unknown; addEventListener?: unknown } | null;
  if (
    typeof s !== "object" ||
    s === null ||
    typeof s.aborted !== "boolean" ||
    typeof s.addEventListener !== "function"
  ) {
    throw new TypeError(`signal must be an AbortSignal, not ${what(signal)}`);
  }
  return signal as AbortSignal;
}
