"""`python -m iolib.cli ...` runs the `iolib` command (where the console script is not on PATH)."""

from iolib.cli import main

main()
