"""The decoding loop: a session (`decoding.generate`), each round drafted, verified and judged
(`rounds`), and its transcript, the events a front end reads (`transcript`, `detok`)."""
