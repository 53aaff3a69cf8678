"""Load: requests from public traces and synthetic generators, and the HTTP client that sends them
through an OpenAI-compatible endpoint."""
