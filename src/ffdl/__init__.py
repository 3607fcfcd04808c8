"""ffdl: an event-sourced multi-tenant deep-learning training platform core."""

from ffdl.native import install

install()  # the planner's compiled modules, where a build of these sources is there (ffdl.native)
