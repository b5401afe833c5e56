"""Per-tenant quotas over REST: admins set, read and clear them."""
