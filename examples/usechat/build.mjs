// Bundles examples/usechat/app.jsx into OUT/app.js (default: examples/usechat/dist) with esbuild,
// from the repository's node_modules (npm ci). Usage: node examples/usechat/build.mjs [OUT]
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? join(here, "dist"));
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(here, "app.jsx")],
  bundle: true,
  outfile: join(out, "app.js"),
  jsx: "automatic",
  format: "iife",
  define: { "process.env.NODE_ENV": '"production"' },
  minify: true,
  logLevel: "warning",
});
copyFileSync(join(here, "index.html"), join(out, "index.html"));
console.log(out);
