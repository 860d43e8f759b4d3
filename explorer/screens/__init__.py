"""Modal dialogs and full screens: feed, verify options, export, step mode, help, open."""
