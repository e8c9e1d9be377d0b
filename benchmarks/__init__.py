"""benchmarks."""

# Every benchmark's --smoke: its smallest settings, to check in seconds that
# it runs (CI runs each one the docs name); its figures mean nothing.
SMOKE_HELP = "smallest settings, seconds: checks that it runs, measures nothing"
