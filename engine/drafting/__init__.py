"""What proposes tokens: the drafter interface and the draft model and prompt lookup (`drafters`),
the feature head (`heads`, `head_drafter`), a draft with its own vocabulary (`cross_vocab`,
`vocabulary`), copies from earlier text (`suffix`, `suffix_drafting`, `past_sessions`) and the
target with layers skipped (`layer_skip`)."""
