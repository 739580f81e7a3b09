"""The generation APIs, each an adapter over `server.pipeline`: it parses its request, calls
the pipeline and renders the reply or the stream in its own shape.

- `chat`: /v1/chat/completions
- `completions`: /v1/completions
- `responses`: /v1/responses (items, its event stream and the stored responses)
- `messages`: Anthropic's /v1/messages and /v1/messages/count_tokens
"""
