"""ffdl."""
