"""`python -m researcher ...` = the `researcher` command."""

from researcher.cli import main

main()
