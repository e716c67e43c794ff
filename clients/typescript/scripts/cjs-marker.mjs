// dist/cjs holds the CommonJS build: a package.json there tells Node so,
// inside a package whose own "type" is "module".
import { writeFileSync } from 'node:fs';
writeFileSync(new URL('../dist/cjs/package.json', import.meta.url), '{"type": "commonjs"}\n');
