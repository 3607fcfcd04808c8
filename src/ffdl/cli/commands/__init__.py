"""The ``ffdl`` commands by group; :mod:`ffdl.cli.main` composes them into one typer app."""
