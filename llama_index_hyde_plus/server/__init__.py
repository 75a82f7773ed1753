"""The Retrieval Context Protocol server (stdio and HTTP) and its index writes."""
