"""`grpoflow view`: a local web page of runs' curves, rollouts and facts (server.py serves, run_folder.py reads)."""
