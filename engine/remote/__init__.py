"""A target served over an OpenAI-compatible API: the target (`remote_target`), scoring drafts
from the server's log-probabilities (`remote_scoring`) and the requests (`remote_http`)."""
