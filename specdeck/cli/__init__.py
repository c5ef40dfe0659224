"""The `specdeck` command line: above both the engine and the window, it parses arguments, prints
to the terminal and opens the window (`specdeck gui`). Entry point: `specdeck.cli.main.main`."""
