"""The one exception type whose message is meant for the user."""


class SpecDeckError(Exception):
    """Bad input or an unusable model: the message says what is wrong and what to do."""
