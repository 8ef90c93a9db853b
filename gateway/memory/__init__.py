"""Open memory and skills: what the organization knows, decided and learned, as readable documents."""
