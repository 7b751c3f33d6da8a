"""Fleet: what exists and who may use it (tenancy, tokens, quotas, inventory, adapters)."""
