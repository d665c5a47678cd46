// Copies Swagger UI (npm swagger-ui-dist) into the Python package, served by the API at
// /docs/static: the API page loads nothing from another origin (a CDN's script would run
// with a signed-in browser's rights, and hospital networks often reach no CDN at all).
import { copyFileSync, mkdirSync } from 'node:fs'

const from = 'node_modules/swagger-ui-dist/'
const to = '../src/radserve/api/static/swagger/'
mkdirSync(to, { recursive: true })
for (const name of ['swagger-ui-bundle.js', 'swagger-ui.css', 'LICENSE']) {
  copyFileSync(from + name, to + name)
}
