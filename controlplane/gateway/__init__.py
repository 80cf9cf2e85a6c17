"""The OpenAI-compatible gateway: API keys, the /v1/ endpoints, tokenization and the router."""
