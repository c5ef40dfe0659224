"""SpecDeck: speculative decoding, token by token.

`specdeck.engine` decodes (Qt-free), `specdeck.app` is the window, `specdeck.cli` the command line,
`specdeck.resources` the bundled files, `specdeck.bench` and `specdeck.train` measure and train.
"""
