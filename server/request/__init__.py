"""Request parsing: the typed parameters, constraints, limits and hints read from a body."""
