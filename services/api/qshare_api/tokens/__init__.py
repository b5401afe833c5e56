"""Tokens over REST: admins issue and revoke bearer tokens for tenants and admins."""
