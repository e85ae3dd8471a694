"""The APIs serve speaks, one module and one Protocol object each: OpenAI's chat and completions
(openai.py) and Responses (responses.py), Anthropic's (anthropic.py) and Ollama's (ollama.py), over what
they share (shared.py). A protocol reads its requests into a Request, answers a finished or running job
in its own shape (whole, or streamed in its own framing), and says errors its own way; server.py routes
each path to a handler and a protocol, and knows none of their shapes."""
