"""/v1/messages: Anthropic's Messages API over the generation pipeline (request conversion in
`convert`, bodies and the event stream in `render`, its error shape in `errors`)."""
