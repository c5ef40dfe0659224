"""SpecDeck: speculative decoding, token by token. Its packages are the repository's
top-level folders `engine`, `app`, `cli` and `resources`, linked here."""
