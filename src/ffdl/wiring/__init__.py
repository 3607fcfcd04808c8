"""The composition root: settings, logging, and the process that wires adapters to roles."""
