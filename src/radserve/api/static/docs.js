// The API reference page (/docs): Swagger UI from this server (/docs/static), reading the
// schema with the browser's own credentials (a console session, or none: then 401).
window.addEventListener('load', () => {
  window.ui = SwaggerUIBundle({ url: '/openapi.json', dom_id: '#swagger-ui' })
})
