"""ffdl: an event-sourced multi-tenant deep-learning training platform core."""
