"""The HTTP routes, by what they serve."""
