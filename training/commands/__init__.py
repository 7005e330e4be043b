"""The CLI's subcommands, one module each; the library they share lives in `training/` itself."""
