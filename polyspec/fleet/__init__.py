"""`polyspec up`'s fleet: what runs (polyspec.fleet.plan, from the registry or a fleet YAML read by
polyspec.fleet.config) and running it (polyspec.fleet.run: engines, self-checks, then the router)."""
