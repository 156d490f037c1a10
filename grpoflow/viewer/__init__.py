"""`grpoflow view`: a local web page of runs' curves, rollouts and facts (server.py serves, watched_run.py reads)."""
