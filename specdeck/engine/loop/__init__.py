"""The decoding loop: a session (`specdeck.engine.loop.decoding.generate`), each round in its parts
(`schedule`, `drafting_step`, `target_forward`, `verification`, `clock`, what it verifies:
`draft_tree`), and its transcript, the events a front end reads (`transcript`, `detok`)."""
