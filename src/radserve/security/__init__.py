"""API keys and roles (authentication; the API layer enforces them per route)."""

from radserve.security.keys import (
    ROLE_GRANTS,
    NewKey,
    Role,
    generate_key,
    parse_token,
    role_allows,
)

__all__ = ["ROLE_GRANTS", "NewKey", "Role", "generate_key", "parse_token", "role_allows"]
