// Builds the console into the Python package (served by `radserve serve` at /).
import { defineConfig } from 'vite'

export default defineConfig({
  root: '.',
  base: '/console/',
  build: {
    outDir: '../src/radserve/console/static',
    emptyOutDir: true,
    assetsDir: 'assets',
    sourcemap: false,
    chunkSizeWarningLimit: 2000,
  },
})
