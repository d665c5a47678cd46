"""The API's routers: studies (submission), jobs (status, results), ops (health, metrics)."""
