"""The vault's secrets: versioned values under their own envelope, kept in the internal bucket."""
