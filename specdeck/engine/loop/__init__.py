"""The decoding loop: a session (`specdeck.engine.loop.decoding.generate`), each round drafted, verified and judged
(`rounds`), and its transcript, the events a front end reads (`transcript`, `detok`)."""
