"""Vertex AI's prediction protocol, for a custom container on Google Cloud."""
