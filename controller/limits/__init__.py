"""Fair use and failing closed: quotas, disk, input limits, login throttling, body size, outages as 503."""
