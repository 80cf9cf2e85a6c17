"""Tool calls on /v1/chat/completions: the request's tools, their rendering, and the model's calls read
back from its output (docs/gateway.md, "Tool calls")."""
