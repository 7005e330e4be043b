"""The CLI's subcommands, one module each: its parser (`register`), what an interruption leaves
(`INTERRUPTED`) and `run`, which imports the command's implementation from the library in `training/` only
when called, so that `--help` needs neither torch nor the training extra."""
