"""CLI subcommands, one module each; registered in radserve.cli."""
