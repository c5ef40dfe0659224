"""`specdeck bench`: tokens/s of SpecDeck's plain and speculative decoding against Hugging Face's
`generate()` and its own speculative decoding, on the same prompts, in one alternating run.

Nothing is imported here: the settings and prompts (`settings`, `prompts`) stay free of torch for
the window's Benchmark tab, and the runner (`runner`, `service`) imports the engine.
"""
