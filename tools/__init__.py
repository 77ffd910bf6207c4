"""Contributor tools (generated docs); nothing here is imported by the product."""
