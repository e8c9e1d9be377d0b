"""`python -m vidjax.plot WORKDIR`: a run's training curves as PNG files.
The command's code is `vidjax.report.plot`."""

from vidjax.report import plot

if __name__ == "__main__":
  raise SystemExit(plot.main())
