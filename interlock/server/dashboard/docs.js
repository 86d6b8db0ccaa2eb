// /docs: Swagger UI (its files from the fastapi-offline package, served by this server)
// over this server's /openapi.json; nothing is loaded from elsewhere.
window.addEventListener("DOMContentLoaded", () => {
  window.SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });
});
