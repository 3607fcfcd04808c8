"""``python -m ffdl.adapters.cli`` runs the CLI, as the ``ffdl`` script does."""

from ffdl.adapters.cli.main import app

app()
