"""``python -m ffdl.cli`` runs the CLI, as the ``ffdl`` script does."""

from ffdl.cli.main import app

app()
