// npm runs `prepare` when it installs this package from a directory or a git
// URL (`npm install ./node`) and before `npm pack`: it builds dist/, which the
// package's entry points name. A directory install does not install this
// package's devDependencies, so TypeScript comes from `npm ci` (the versions
// package-lock.json pins) when it is missing. A tarball (npm pack) carries
// dist/ already: npm never runs `prepare` when installing one.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));

// The npm that runs this script (npm_execpath), else the one on PATH.
function npm(args) {
  const cli = process.env.npm_execpath;
  const [cmd, argv] = cli?.endsWith(".js") ? [process.execPath, [cli, ...args]] : ["npm", args];
  execFileSync(cmd, argv, { cwd: root, stdio: "inherit" });
}

try {
  if (!existsSync(`${root}node_modules/typescript/bin/tsc`)) {
    // --ignore-scripts: `npm ci` here would run this script again.
    npm(["ci", "--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund"]);
  }
  npm(["run", "build"]);
} catch (e) {
  console.error(
    `warden-redis: building dist/ failed (${e.message}); in ${root}: npm ci && npm run build`,
  );
  process.exit(1);
}
