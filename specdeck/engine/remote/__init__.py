"""A target served over an OpenAI-compatible API: the target (`remote_target`), scoring drafts
from the server's log-probabilities (`remote_scoring`), the requests (`remote_http`) and the
schemas every answer is checked against (`remote_answers`)."""
