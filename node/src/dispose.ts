// `await using` needs Symbol.asyncDispose (Node 18.18+ and 20.4+ have it);
// imported before any class that names it.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for("nodejs.asyncDispose");
