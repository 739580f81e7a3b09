"""/v1/responses: OpenAI's Responses API as an adapter over the chat pipeline.

- `items`: request items to chat messages, and an answer to output items;
- `stream`: the API's streamed events;
- `store`: the responses kept for `previous_response_id`;
- `route`: the handlers.
"""
