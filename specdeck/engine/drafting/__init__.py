"""What proposes tokens: the drafter interface and prompt lookup (`drafters`), what a drafter hands
the loop (`proposals`), the draft model (`draft_model`), the feature head (`heads`,
`head_drafter`), a draft with its own vocabulary (`cross_vocab`, `vocabulary`), copies from earlier
text (`suffix`, `suffix_drafting`, `past_sessions`) and the target with layers skipped
(`layer_skip`)."""
