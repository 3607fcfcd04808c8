"""Example learner programs that run on ffdl unchanged outside it too."""
