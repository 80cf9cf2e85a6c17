"""The OpenAI surface: the /v1/ views, their request parsing, a request's generation (admission,
routing, migration), tokenization, streamed text and OpenAI's error shape."""
