"""`python -m store upgrade|downgrade|current|check` (same as `swarm db ...`)."""

from store.cli import main

main()
